"""What an operator can ask and do, in one place for the CLI and the HTTP API.

Answers are JSON-ready dicts (the API's documented shapes): the CLI renders
the same dicts whether it reached the database or a replica's API. Times given
without an offset are read in the job's zone; every answer carries UTC and the
job's zone. Every action is recorded in ``operator_actions`` with who asked.
"""

from actors.operator.actions import OperatorService
from actors.operator.errors import (
    BadInput,
    Forbidden,
    NotFound,
    NothingToDo,
    OperatorError,
    Unauthorized,
    Unavailable,
    Unprocessable,
)
from actors.ports import Caller

__all__ = [
    "BadInput",
    "Caller",
    "Forbidden",
    "NotFound",
    "NothingToDo",
    "OperatorError",
    "OperatorService",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
]
