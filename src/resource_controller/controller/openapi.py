"""The published OpenAPI document: what every route really takes and answers.

Request bodies are parsed by hand (``deps.body``) so that authentication always comes
first and a bad body is our ``400 bad_request``; the framework therefore
sees no body, query parameter or security on the routes. This module adds them from
one table, so a fuzzer reading the document reaches every field: the wire models as
request bodies, the query parameters each route reads, the bearer scheme with the
role each route needs, and the error responses (``ErrorBody``) each can answer. The
framework's ``422`` is never sent and is removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pydantic
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from resource_controller import wire

SCHEMAS = "#/components/schemas/"
JSON = "application/json"


@dataclass(frozen=True)
class Query:
    name: str
    schema: dict[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True)
class Op:
    """What one route takes and may answer besides its success."""

    role: str
    errors: tuple[int, ...] = ()
    body: type[pydantic.BaseModel] | None = None
    body_required: bool = False
    raw_body: bool = False
    #: What the raw body carries, when ``raw_body``.
    raw_note: str = "a raw chunk of the job's output, at most 1 MiB (API-036)"
    query: tuple[Query, ...] = ()
    #: Success answers with no body: status -> description (replaces the framework's).
    empty: dict[str, str] = field(default_factory=dict)
    #: Success answers with a non-JSON body: status -> (media type, description).
    text: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Documented server-side failures the route can answer (the spec names them).
    failures: dict[str, str] = field(default_factory=dict)
    #: Answers with a fixed small JSON object: status -> (description, example). A role
    #: of "none" means no token at all.
    json: dict[str, tuple[str, dict[str, str | bool]]] = field(default_factory=dict)


_EMPTY_OK = {"200": "done; empty body (API-008)"}
_STR = {"type": "string"}

#: (method, path) -> what the route takes and answers (controller-api.md §4, §6, §7).
ROUTES: dict[tuple[str, str], Op] = {
    ("post", "/v1/workers/register"): Op("worker", (400, 413), body=wire.RegisterRequest),
    ("post", "/v1/workers/{worker_id}/labels"): Op(
        "worker", (400, 404, 413), body=wire.LabelsPush, empty=_EMPTY_OK
    ),
    ("get", "/v1/workers/{worker_id}/assignments"): Op(
        "worker",
        (),
        query=(
            Query(
                "wait",
                _STR,
                "long-poll wait as a duration (e.g. 30s); honoured in (0, 1 min], else 30 s",
            ),
        ),
    ),
    ("post", "/v1/workers/{worker_id}/heartbeat"): Op(
        "worker", (400, 413), body=wire.HeartbeatRequest, empty=_EMPTY_OK
    ),
    ("post", "/v1/jobs/{job_id}/logs"): Op(
        "worker",
        (404, 409, 413),
        raw_body=True,
        query=(
            Query(
                "lease_epoch",
                _STR,
                "the sender's lease epoch; an old one is 409 stale_lease (EXT-EPOCH-3)",
            ),
        ),
        empty=_EMPTY_OK,
        failures={
            "500": "log_error: the job ID cannot name a log file, or the append failed (LOG-001)"
        },
    ),
    ("post", "/v1/jobs/{job_id}/status"): Op(
        "worker", (400, 403, 404, 409, 413), body=wire.StatusReport, empty=_EMPTY_OK
    ),
    ("post", "/v1/devices/{device_id}/fault"): Op(
        "worker", (400, 404, 413), body=wire.FaultReport, empty=_EMPTY_OK
    ),
    ("post", "/v1/jobs"): Op("client", (400, 409, 413), body=wire.SubmitRequest),
    ("get", "/v1/jobs"): Op(
        "client",
        (400,),
        query=(
            Query(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": 200},
                "at most this many jobs, newest first (default 20)",
            ),
            Query("state", _STR, "only jobs in this state"),
            Query("device", _STR, "only jobs on this device"),
            Query("submitter", _STR, "only jobs of this submitter"),
            Query("id_prefix", _STR, "only jobs whose ID starts with this (EXT-CLI-7)"),
            Query(
                "before",
                _STR,
                "a job ID: only the jobs after it in this order, the next page of a listing;"
                " an unknown ID is 400",
            ),
        ),
    ),
    ("get", "/v1/jobs/{job_id}"): Op("client", (404,)),
    ("post", "/v1/jobs/{job_id}/kill"): Op(
        "client",
        (400, 403, 404, 409, 413),
        body=wire.KillRequest,
        body_required=True,
        empty=_EMPTY_OK,
    ),
    ("get", "/v1/jobs/{job_id}/logs"): Op(
        "client",
        (400, 404),
        query=(
            Query(
                "follow",
                {"type": "string", "enum": ["true", "false"]},
                "true (the default): replay, then stream until the job ends; false: a snapshot",
            ),
            Query(
                "offset",
                {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                "byte offset to start from (EXT-CLI-5); past the end a snapshot is empty",
            ),
        ),
        text={"200": ("text/plain", "the stored output, raw bytes (API-049, LOG-003)")},
    ),
    ("get", "/v1/jobs/{job_id}/tty/out"): Op(
        "client",
        (404, 409),
        text={"200": ("application/octet-stream", "the job's output, streamed raw (TTY-001)")},
        failures={"500": "store_error: the job could not be looked up (TTY-003)"},
    ),
    ("post", "/v1/jobs/{job_id}/tty/in"): Op(
        "client",
        (404, 409),
        raw_body=True,
        raw_note="operator input, streamed for the session's life (TTY-012, TTY-031)",
        text={"200": ("text/plain", "connected; the body carries nothing (TTY-011)")},
        failures={"500": "store_error, or unsupported: no full-duplex stream (TTY-012)"},
    ),
    ("post", "/v1/jobs/{job_id}/tty/out"): Op(
        "worker",
        (404, 409),
        raw_body=True,
        raw_note="the job's output, streamed for its life (TTY-012, TTY-032)",
        text={"200": ("text/plain", "connected; the body carries nothing (TTY-011)")},
        failures={"500": "store_error, or unsupported: no full-duplex stream (TTY-012)"},
    ),
    ("get", "/v1/jobs/{job_id}/tty/in"): Op(
        "worker",
        (404, 409),
        text={"200": ("application/x-ndjson", "operator input, streamed (TTY-001, TTY-031)")},
        failures={"500": "store_error: the job could not be looked up (TTY-003)"},
    ),
    ("get", "/v1/devices"): Op("client"),
    ("get", "/v1/state"): Op("client"),
    ("get", "/v1/devices/{device_id}/describe"): Op("client", (404,)),
    ("get", "/v1/explain"): Op(
        "client",
        (400,),
        query=(
            Query("selector", _STR, "the selector to explain (SEL-001)", required=True),
            Query(
                "submitter",
                _STR,
                "who asks: the answer then carries that submitter's limit, when one applies"
                " (EXT-SHARE-1)",
            ),
        ),
    ),
    ("get", "/v1/usage"): Op(
        "client",
        (400,),
        query=(
            Query(
                "since",
                {"type": "string", "default": "7d"},
                "the window: from the start of the hour that holds now minus this duration"
                " (units w, d, h, m, s: 7d, 36h, 1d12h) to now (EXT-ACCT-2)",
            ),
            Query(
                "by",
                {"type": "string", "enum": ["submitter", "device", "host"]},
                "what a group is (default submitter)",
            ),
            Query(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": 1000},
                "at most this many groups, the largest first (default 1000); the total"
                " counts every one",
            ),
        ),
    ),
    ("get", "/v1/whoami"): Op("client"),
    ("post", "/v1/devices/{device_id}/clear"): Op("admin", (409,), empty=_EMPTY_OK),
    ("post", "/v1/devices/{device_id}/drain"): Op(
        "admin", (400, 404, 413), body=wire.DrainRequest, empty=_EMPTY_OK
    ),
    ("post", "/v1/devices/{device_id}/undrain"): Op("admin", (404,), empty=_EMPTY_OK),
    ("delete", "/v1/devices/{device_id}"): Op("admin", (404, 409)),
    ("get", "/v1/events"): Op(
        "client",
        (),
        query=(
            Query(
                "token",
                _STR,
                "the client token, read only when the Authorization header carries none "
                "(AUTH-004: for a browser EventSource)",
            ),
        ),
        text={
            "200": (
                "text/event-stream",
                "server-sent events: `data: {kind, at, payload?}` frames and keepalives (EVT-002)",
            )
        },
    ),
    ("get", "/healthz"): Op(
        "none",
        json={
            "200": (
                "the store answered a read; leader: this controller runs the scheduler and"
                " the reaper (EXT-PG-8)",
                {"status": "ok", "leader": True},
            ),
            "503": ("the store did not answer a read", {"status": "unavailable", "leader": False}),
        },
    ),
    ("get", "/metrics"): Op(
        "client",
        text={"200": ("text/plain", "Prometheus text exposition format (EXT-METRICS-1)")},
    ),
    ("get", "/openapi.json"): Op("client"),
    ("get", "/"): Op(
        "none",
        text={"200": ("text/html", "the dashboard page, script and style inline (DASH-001)")},
    ),
}

_ROLE_NOTE = {
    "worker": "Role: worker (a worker or an admin token, AUTH-002).",
    "client": "Role: client (a client or an admin token, AUTH-002).",
    "admin": "Role: admin (an admin token only, AUTH-002).",
    "none": "No token: anyone may ask (AUTH-001, EXT-METRICS-3).",
}
_ERROR_NOTE = {
    400: "bad_request, or the route's own 400 code (API-090)",
    401: "unauthorized: missing, malformed or unknown bearer token (AUTH-003)",
    403: "forbidden: the token's role does not satisfy the route; or not_job_owner",
    404: "not_found (or device_not_found for retire)",
    409: "the request conflicts with the current state (API-090)",
    413: "body_too_large, chunk_too_large or sheet_too_large (EXT-LIMITS-2)",
}


def _error(status: int) -> dict[str, Any]:
    return {
        "description": _ERROR_NOTE[status],
        "content": {JSON: {"schema": {"$ref": SCHEMAS + "ErrorBody"}}},
    }


def _add_models(schemas: dict[str, Any], *models: type[pydantic.BaseModel]) -> None:
    for model in models:
        found = model.model_json_schema(ref_template=SCHEMAS + "{model}")
        for name, sub in found.pop("$defs", {}).items():
            schemas.setdefault(name, sub)
        schemas[model.__name__] = found


def _openapi_route() -> dict[str, Any]:
    return {
        "get": {
            "summary": "Openapi",
            "operationId": "openapi",
            "description": "This document.",
            "responses": {
                "200": {
                    "description": "the OpenAPI document",
                    "content": {JSON: {"schema": {"type": "object"}}},
                }
            },
        }
    }


def document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app``, completed from ``ROUTES``."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    doc["paths"]["/openapi.json"] = _openapi_route()
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _add_models(schemas, wire.ErrorBody)
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "Authorization: Bearer <token>, a token from RC_TOKENS (AUTH-001)",
        }
    }
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            spec = ROUTES.get((method, path))
            if spec is None:
                raise KeyError(f"{method.upper()} {path} is missing from controller/openapi.ROUTES")
            _complete(op, spec, schemas)
    missing = [f"{m.upper()} {p}" for m, p in ROUTES if m not in doc["paths"].get(p, {})]
    if missing:
        raise KeyError(f"ROUTES names routes the app lacks: {missing}")
    return doc


def _property(example: str | bool) -> dict[str, Any]:
    """A string field takes exactly its example's value; a flag either value."""
    if isinstance(example, bool):
        return {"type": "boolean"}
    return {"type": "string", "enum": [example]}


def _complete(op: dict[str, Any], spec: Op, schemas: dict[str, Any]) -> None:
    op["description"] = "\n\n".join(
        part for part in (op.get("description", ""), _ROLE_NOTE[spec.role]) if part
    )
    responses: dict[str, Any] = op.setdefault("responses", {})
    responses.pop("422", None)
    for status, (note, example) in spec.json.items():
        responses[status] = {
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
    if spec.role == "none":
        for status, (media, note) in spec.text.items():
            responses[status] = {"description": note, "content": {media: {"schema": _STR}}}
        op["security"] = []
        return
    op["security"] = [{"bearer": []}]
    for status, note in spec.empty.items():
        responses[status] = {"description": note}
    for status, (media, note) in spec.text.items():
        responses[status] = {"description": note, "content": {media: {"schema": _STR}}}
    for code in sorted({401, 403, *spec.errors}):
        responses[str(code)] = _error(code)
    for status, note in spec.failures.items():
        responses[status] = {
            "description": note,
            "content": {JSON: {"schema": {"$ref": SCHEMAS + "ErrorBody"}}},
        }
    params = [p for p in op.get("parameters", []) if p.get("in") != "query"]
    for q in spec.query:
        params.append(
            {
                "name": q.name,
                "in": "query",
                "required": q.required,
                "schema": q.schema,
                "description": q.description,
            }
        )
    if params:
        op["parameters"] = params
    if spec.body is not None:
        _add_models(schemas, spec.body)
        op["requestBody"] = {
            "required": spec.body_required,
            "content": {JSON: {"schema": {"$ref": SCHEMAS + spec.body.__name__}}},
        }
    elif spec.raw_body:
        op["requestBody"] = {
            "required": False,
            "description": spec.raw_note,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
