"""The operator's HTTP API: its routes (``handlers``), how a request is read and an answer
sent through the models of actors/http/openapi (``reading``), and every failure as JSON
(``errors``)."""

from actors.http.api.errors import answer_parser_errors_as_json, error_response, json_errors
from actors.http.api.handlers import OperatorApi

__all__ = ["OperatorApi", "answer_parser_errors_as_json", "error_response", "json_errors"]
