"""The OpenAPI document, from the route table, so a fuzzer reaches every field."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Sequence
from typing import Any, Literal

import pydantic

from resource_controller import wire
from resource_controller.controller.answers import JSON
from resource_controller.controller.deps import Route

SCHEMAS = "#/components/schemas/"

_ROLE_NOTE = {
    "worker": "Role: worker (a worker or an admin token, AUTH-002).",
    "client": "Role: client (a client or an admin token, AUTH-002).",
    "admin": "Role: admin (an admin token only, AUTH-002).",
    None: "No token: anyone may ask (AUTH-001, EXT-METRICS-3).",
}
_ERROR_NOTE = {
    400: "bad_request, or the route's own 400 code (API-090)",
    401: "unauthorized: missing, malformed or unknown bearer token (AUTH-003)",
    403: "forbidden: the token's role does not satisfy the route; or not_job_owner",
    404: "not_found (or device_not_found for retire)",
    409: "the request conflicts with the current state (API-090)",
    413: "body_too_large, chunk_too_large or sheet_too_large (EXT-LIMITS-2)",
}
_ERROR_BODY = {JSON: {"schema": {"$ref": SCHEMAS + "ErrorBody"}}}
#: What a route answers with no JSON, text or example of its own.
_DONE = {200: "done; empty body (API-008)"}
_TEXT = {"type": "string"}

#: The document's text, written once per process (the routes never change).
_published: list[bytes] = []


def published(routes: Sequence[Route]) -> bytes:
    """The document of ``routes`` as the body of ``GET /openapi.json``."""
    if not _published:
        _published.append(json.dumps(document(routes)).encode())
    return _published[0]


def document(routes: Sequence[Route]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, schemas)
    _schema(schemas, wire.ErrorBody, "serialization")
    return {
        "openapi": "3.1.0",
        "info": {"title": "resource-controller", "version": "0.1.0"},
        "paths": paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Authorization: Bearer <token>, a token from RC_TOKENS (AUTH-001)",
                }
            },
        },
    }


def _schema(
    schemas: dict[str, Any], kind: Any, mode: Literal["validation", "serialization"]
) -> dict[str, Any]:
    """The schema of ``kind``; the models go to ``schemas`` and are referred to."""
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(kind)
    found = adapter.json_schema(mode=mode, ref_template=SCHEMAS + "{model}")
    for name, sub in found.pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    if isinstance(kind, type) and issubclass(kind, pydantic.BaseModel):
        schemas[kind.__name__] = found
        return {"$ref": SCHEMAS + kind.__name__}
    return found


def _property(example: str | bool) -> dict[str, Any]:
    """A string field takes exactly its example's value; a flag either value."""
    if isinstance(example, bool):
        return {"type": "boolean"}
    return {"type": "string", "enum": [example]}


def _operation(route: Route, schemas: dict[str, Any]) -> dict[str, Any]:
    name = route.handler.__name__
    role = route.role.value if route.role else None
    op: dict[str, Any] = {
        "summary": name.replace("_", " ").title(),
        "operationId": re.sub(r"\W", "_", name + route.path) + "_" + route.method.lower(),
        "description": "\n\n".join(
            part for part in (inspect.getdoc(route.handler), _ROLE_NOTE[role]) if part
        ),
    }
    params: list[dict[str, Any]] = [
        {
            "name": p,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "title": p.replace("_", " ").title()},
        }
        for p in re.findall(r"\{(\w+)\}", route.path)
    ]
    params += [
        {
            "name": q.name,
            "in": "query",
            "required": q.required,
            "schema": q.schema,
            "description": q.description,
        }
        for q in route.query
    ]
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {
            "required": route.body_required,
            "content": {JSON: {"schema": _schema(schemas, route.body, "validation")}},
        }
    elif route.raw:
        op["requestBody"] = {
            "required": False,
            "description": route.raw,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    responses: dict[str, Any] = {}
    if route.answer is not None:
        schema = _schema(schemas, route.answer, "serialization")
        responses[str(route.status)] = {
            "description": "Successful Response",
            "content": {JSON: {"schema": schema}},
        }
    plain = route.answer is None and route.text is None and not route.examples
    for status, note in (route.empty or (_DONE if plain else {})).items():
        responses[str(status)] = {"description": note}
    if route.text is not None:
        media, note = route.text
        responses[str(route.status)] = {"description": note, "content": {media: {"schema": _TEXT}}}
    for status, (note, example) in route.examples.items():
        responses[str(status)] = {
            "description": note,
            "content": {
                JSON: {
                    "schema": {
                        "type": "object",
                        "properties": {k: _property(v) for k, v in example.items()},
                        "required": sorted(example),
                    }
                }
            },
        }
    if role is None:
        op["security"] = []
    else:
        op["security"] = [{"bearer": []}]
        # A JSON body can be refused as bad or too large.
        for code in sorted({401, 403, *route.errors, *((400, 413) if route.body else ())}):
            responses[str(code)] = {"description": _ERROR_NOTE[code], "content": _ERROR_BODY}
        if route.failure:
            responses["500"] = {"description": route.failure, "content": _ERROR_BODY}
    op["responses"] = responses
    return op
