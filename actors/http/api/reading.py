"""A request read through its operation's models, and an answer sent through its model.

What the models refuse is a 400 naming the parameter or field and what it
must be; the document says the same, because it is built from these models.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from actors.http.guard import BODY_TIMEOUT_KEY
from actors.http.openapi.fields import PATTERN_HELP
from actors.operator import BadInput, OperatorError

Model = TypeVar("Model", bound=BaseModel)
JSON = "application/json"
DEFAULT_BODY_TIMEOUT_S = 30.0


class UnsupportedMediaType(OperatorError):
    """A body sent as anything but application/json."""

    status = 415


class BodyTimeout(OperatorError):
    """A body that did not arrive within the body timeout (a client trickling bytes)."""

    status = 408


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _problem(error: ErrorDetails, where: str, fields: list[str]) -> str:
    """One line for the first thing the model refused."""
    kind, loc, given = error["type"], error["loc"], error.get("input")
    name = ".".join(str(part) for part in loc if not isinstance(part, int))  # not 'state.0'

    if kind == "json_invalid":
        return f"the body is not JSON ({error['msg'].removeprefix('Invalid JSON: ')})"
    if kind in ("model_type", "model_attributes_type") and not loc:
        return "the body must be a JSON object"
    if kind == "extra_forbidden":
        return f"unknown field {name!r}; allowed: {', '.join(fields)}"
    if kind == "missing":
        return f"{where} {name!r} is required"
    if kind == "string_pattern_mismatch":
        help_text = PATTERN_HELP.get(str((error.get("ctx") or {}).get("pattern")), "")
        return f"{where} {name!r}: {_shown(given)} is not {help_text}"
    message = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    return f"{where} {name!r} {message}, got {_shown(given)}"


def _validate(model: type[Model], data: Any, where: str) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadInput(_problem(exc.errors()[0], where, _names(model))) from None


def _names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def path_of(request: web.Request, model: type[Model]) -> Model:
    """The path parameters, e.g. a job's name; one that cannot be a name is a 400."""
    return _validate(model, dict(request.match_info), "path parameter")


def query_of(request: web.Request, model: type[Model]) -> Model:
    """The query parameters the model names (others are ignored); each at most once."""
    data: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        values = request.query.getall(key, [])
        if not values:
            continue
        if _is_list(field.annotation):
            data[key] = values
        elif len(values) > 1:
            raise BadInput(f"query parameter {key!r} is given {len(values)} times; once at most")
        else:
            data[key] = values[0]
    return _validate(model, data, "query parameter")


def _is_list(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is list


async def body_of(request: web.Request, model: type[Model], required: bool = False) -> Model:
    """The JSON object body; an empty one is ``{}`` unless the body is required.

    It must arrive within the body timeout (setting http_body_timeout): 408 if not.
    """
    limit = float(request.get(BODY_TIMEOUT_KEY, DEFAULT_BODY_TIMEOUT_S))
    try:
        async with asyncio.timeout(limit):
            raw = await request.read()
    except TimeoutError:
        # Answered; aiohttp then reads what is left for its lingering time at most.
        raise BodyTimeout(f"the body did not arrive within {limit:g}s") from None
    if not raw.strip():
        if required:
            raise BadInput(f"a JSON object body is required (fields: {', '.join(_names(model))})")
        return _validate(model, {}, "field")
    if request.content_type != JSON:
        raise UnsupportedMediaType(
            f"the body must be sent as {JSON}, not {request.content_type or 'no content type'}"
        )
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise BadInput(_problem(exc.errors()[0], "field", _names(model))) from None


def answer(model: type[BaseModel], data: Any, status: int = 200) -> web.Response:
    """``data`` sent through ``model``: the answer holds what the document says, no more."""
    body = model.model_validate(data).model_dump_json(by_alias=True)
    return web.Response(body=body.encode(), status=status, content_type=JSON, charset="utf-8")
