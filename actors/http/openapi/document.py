"""The OpenAPI 3.1 document, built from the operations table and the models' JSON schemas."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from actors import __version__
from actors.http.openapi.operations import ERRORS, OPERATIONS, Operation, Scope, scope_of
from actors.http.openapi.responses import Error

REF = "#/components/schemas/{model}"
BEARER = "bearerAuth"


class _Schema(GenerateJsonSchema):
    """pydantic's JSON schema without a title on every field (the names say it)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _components() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each answer's and body's $ref, and the schemas they refer to."""
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [(Error, "serialization")]
    for op in OPERATIONS:
        wanted.append((op.answer, "serialization"))
        wanted.extend((model, "serialization") for _, model in op.other.values())
        if op.body is not None:
            wanted.append((op.body, "validation"))
    refs, defs = models_json_schema(
        list(dict.fromkeys(wanted)), ref_template=REF, schema_generator=_Schema
    )
    by_model = {f"{model.__name__}:{mode}": dict(ref) for (model, mode), ref in refs.items()}
    return by_model, defs.get("$defs", {})


def _parameters(model: type[BaseModel] | None, where: str) -> list[dict[str, Any]]:
    """The model's fields as OpenAPI parameters; absent means the default, never null."""
    if model is None:
        return []
    schema = model.model_json_schema(ref_template=REF, schema_generator=_Schema)
    assert "$defs" not in schema, f"{model.__name__}: a parameter is a plain value"
    required = set(schema.get("required", ()))
    out = []
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        description = prop.pop("description", "")
        branches = prop.pop("anyOf", None)
        if branches is not None:  # "X | None = None": the parameter is left out instead
            (value,) = [b for b in branches if b.get("type") != "null"]
            prop = {**value, **prop}
        if prop.get("default", 0) is None:
            del prop["default"]
        param: dict[str, Any] = {
            "name": name,
            "in": where,
            "required": where == "path" or name in required,
            "schema": prop,
        }
        if description or prop.get("description"):
            param["description"] = description or prop.pop("description")
        if prop.get("type") == "array":
            param.update(style="form", explode=True)
        out.append(param)
    return out


def _content(schema: dict[str, Any], media_type: str = "application/json") -> dict[str, Any]:
    return {"content": {media_type: {"schema": schema}}}


def _links(op: Operation) -> dict[str, Any]:
    links: dict[str, Any] = {}
    for link in op.links:
        name = link.operation_id if link.operation_id not in links else f"{link.operation_id}2"
        links[name] = {
            "operationId": link.operation_id,
            "parameters": {link.parameter: link.expression},
        }
    return links


def _operation(
    op: Operation, refs: dict[str, dict[str, Any]], protected: bool, metrics_token: bool
) -> dict[str, Any]:
    error = refs["Error:serialization"]
    ok: dict[str, Any] = {
        "description": "the answer",
        **_content(refs[f"{op.answer.__name__}:serialization"], op.media_type),
    }
    if op.links:
        ok["links"] = _links(op)
    responses: dict[str, Any] = {"200": ok}
    for status, (words, model) in op.other.items():
        responses[str(status)] = {
            "description": words,
            **_content(refs[f"{model.__name__}:serialization"]),
        }
    scope = scope_of(op, metrics_token=metrics_token)
    if scope is not op.scope:  # the setting made it ask for a token: its 401 too
        op = Operation(**{**op.__dict__, "scope": scope})
    for status in op.statuses(protected):
        responses[str(status)] = {"description": ERRORS[status], **_content(error)}
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "responses": responses,
        "x-claimd-scope": scope.value,
    }
    if op.description:
        out["description"] = op.description
    parameters = _parameters(op.path_params, "path") + _parameters(op.query, "query")
    if parameters:
        out["parameters"] = parameters
    if op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            **_content(refs[f"{op.body.__name__}:validation"]),
        }
    if scope is Scope.OPERATE or (scope is Scope.READ and protected):
        out["security"] = [{BEARER: []}]
    return out


@cache
def document(protected: bool = True, metrics_token: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a replica (built once for each configuration).

    ``protected``: tokens are configured, so each read declares the bearer and
    its 401; without tokens only the actions do (and answer 403, read-only).
    ``x-claimd-scope`` names each operation's scope: open, read or operate.
    """
    refs, schemas = _components()
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(
            op, refs, protected, metrics_token and protected
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "claimd",
            "version": __version__,
            "description": "Runs, audit and operator actions of a claimd deployment. Once a "
            "token is configured in the [claimd] settings every read needs a bearer token of "
            "scope read or operate, and every action one of scope operate (x-claimd-scope "
            "names each operation's); without any, reads are open and actions refused. "
            "/healthz, /readyz and this document are always open. A request that does not "
            "match this document answers 400 with a message naming the parameter or field; "
            "one that matches and cannot be done answers 422 (or 404, 409) with the reason.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {BEARER: {"type": "http", "scheme": "bearer"}},
        },
    }
