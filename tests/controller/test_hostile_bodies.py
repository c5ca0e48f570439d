"""Oversized and malformed bodies on every route that takes one (EXT-LIMITS-2, API-001).

The routes come from the route table (``controller/table.py``) (every route with a body model or a raw body),
so a new body route without a case here fails. Each JSON route gets a body over its
cap (``413 body_too_large``), text that is not JSON, a JSON value that is not an object,
every field of its model set to a value of the wrong type, and its spec-named missing
fields; all must be a ``400 bad_request`` whose message names the field, or the code
the spec gives, and the controller must stay healthy. Wrong-type values are chosen
per field by asking the model itself which value it refuses, so a field added to a
model is fuzzed without touching this file.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pydantic
import pytest
from controller_harness import ADMIN, CLIENT, ROUTES, WORKER, Harness, assert_error, role_of
from test_limits import _head, _raw_request

from resource_controller.controller.deps import Route
from resource_controller.controller.routes import workers
from resource_controller.core import limits

#: Candidate wrong-type values; the first one a field's model refuses is used.
WRONG = (12345.5, [{"deep": True}], {"an": "object"}, "not-a-thing", True)

#: The raw-body relay halves stream a session's whole life: they have no size cap to
#: hit and no JSON to break (TTY-012); tests/controller/test_relay_routes.py has them.
STREAMING = {("post", "/v1/jobs/{job_id}/tty/in"), ("post", "/v1/jobs/{job_id}/tty/out")}

#: Fields read leniently on purpose: a worker's measurement out of range is unknown,
#: never a 400, or the outcome it rides with would be retried for ever with the device
#: held (EXT-ACCT-1); tests/controller/test_usage_routes.py checks them.
LENIENT = {
    ("post", "/v1/jobs/{job_id}/status"): {"gpu_util_mean", "gpu_mem_peak_bytes", "samples"},
}

#: Per route: a valid base body, the byte cap, and the spec's answers to missing fields
#: (field or case -> (status, code, word the message must contain)).
CASES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/workers/register"): {
        "base": {"host": "gpubox", "devices": [{"name": "gpu0"}]},
        "missing": {"host": (400, "bad_request", "host")},
    },
    ("post", "/v1/workers/{worker_id}/labels"): {
        "base": {"host": "gpubox", "devices": ["gpu0"]},
        "missing": {"host": (400, "bad_request", "host")},
    },
    ("post", "/v1/workers/{worker_id}/heartbeat"): {
        "base": {"running_job_ids": []},
        "cap": workers.HEARTBEAT_CAP,
        "missing": {},
    },
    ("post", "/v1/jobs/{job_id}/status"): {
        "base": {"worker_id": "{worker_id}", "state": "running"},
        # API-038 step 3: an empty worker_id is 403 not_job_owner; step 5: 400.
        "missing": {
            "worker_id": (403, "not_job_owner", "worker"),
            "state": (400, "bad_request", "state"),
        },
    },
    ("post", "/v1/devices/{device_id}/fault"): {
        "base": {"reason": "verify failed"},
        "missing": {"reason": (400, "bad_request", "reason")},
    },
    ("post", "/v1/jobs"): {
        "base": {"command": ["true"], "submitter": "alice", "device_id": "gpubox:gpu1"},
        "missing": {
            "command": (400, "bad_request", "command"),
            "submitter": (400, "bad_request", "submitter"),
        },
    },
    ("post", "/v1/jobs/{job_id}/kill"): {
        "base": {"submitter": "alice"},
        "missing": {"(no body)": (400, "bad_request", "body")},
    },
    ("post", "/v1/devices/{device_id}/drain"): {"base": {"reason": "maintenance"}, "missing": {}},
    ("post", "/v1/jobs/{job_id}/logs"): {"raw": True, "cap": workers.CHUNK_CAP},
}


def body_routes() -> dict[tuple[str, str], Route]:
    return {k: op for k, op in ROUTES.items() if op.body is not None or op.raw}


def test_every_body_route_has_a_case() -> None:
    assert set(body_routes()) - STREAMING == set(CASES)


@pytest.fixture
def ids(rc: Harness) -> dict[str, str]:
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    job_id, _ = rc.running_job("gpubox:gpu0")
    return {"worker_id": wid, "job_id": job_id, "device_id": "gpubox:gpu1"}


def fill(text: str, ids: dict[str, str]) -> str:
    for name, value in ids.items():
        text = text.replace("{" + name + "}", value)
    return text


def client_for(rc: Harness, role: str) -> httpx.Client:
    return {"worker": rc.worker, "client": rc.client, "admin": rc.admin}[role]


def token_for(role: str) -> str:
    return {"worker": WORKER, "client": CLIENT, "admin": ADMIN}[role]


def wrong_value(model: type[pydantic.BaseModel], base: dict[str, Any], name: str) -> Any:
    """A value for ``name`` that ``model`` refuses while the rest of ``base`` is valid."""
    for value in WRONG:
        try:
            model.model_validate({**base, name: value})
        except pydantic.ValidationError:
            return value
    raise AssertionError(f"{model.__name__}.{name} accepts every candidate: {WRONG}")


@pytest.mark.parametrize("route", sorted(CASES), ids=lambda r: f"{r[0].upper()} {r[1]}")
def test_oversized_body_is_a_clear_413(rc: Harness, ids: dict[str, str], route: Any) -> None:
    """EXT-LIMITS-2 / API-035 / API-036: over the route's cap is 413 with the route's code."""
    op = ROUTES[route]
    case = CASES[route]
    cap = case.get("cap", limits.BODY_BYTES)
    code = "chunk_too_large" if case.get("raw") else "body_too_large"
    path = fill(route[1], ids)
    body = b" " * (cap + 1)
    status, err = _raw_request(
        rc, _head(path, token_for(role_of(op)), f"Content-Length: {cap + 1}\r\n"), [body]
    )
    assert status == 413, (status, err)
    assert set(err) == {"error", "message"} and err["error"] == code, err
    assert str(cap) in err["message"], err
    assert rc.anon.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "route", sorted(k for k, v in CASES.items() if not v.get("raw")), ids=lambda r: r[1]
)
def test_malformed_json_is_400_naming_the_field(
    rc: Harness, ids: dict[str, str], route: Any
) -> None:
    op = ROUTES[route]
    assert op.body is not None
    case = CASES[route]
    c = client_for(rc, role_of(op))
    path = fill(route[1], ids)
    base = json.loads(fill(json.dumps(case["base"]), ids))
    problems: list[str] = []

    def expect(content: bytes, status: int, code: str, word: str) -> None:
        r = c.post(path, content=content, headers={"Content-Type": "application/json"})
        try:
            message = assert_error(r, status, code)
        except AssertionError as exc:
            problems.append(f"{content[:80]!r}: {exc}")
            return
        if word.lower() not in message.lower():
            problems.append(f"{content[:80]!r}: message {message!r} lacks {word!r}")

    for text in (b"{not json", b'{"a": 1', b"\xff\xfe", b"{'single': 'quotes'}"):
        expect(text, 400, "bad_request", "JSON")
    # NaN is read as a number (the parser's leniency), so it is refused as a non-object.
    for value in (b"[1, 2]", b'"a string"', b"42", b"true", b"NaN"):
        expect(value, 400, "bad_request", "body")
    for name in set(op.body.model_fields) - LENIENT.get(route, set()):
        value = wrong_value(op.body, base, name)
        expect(json.dumps({**base, name: value}).encode(), 400, "bad_request", name)
    for name, value in base.items():  # PostgreSQL's text cannot hold NUL; no argv can
        if isinstance(value, str):
            expect(json.dumps({**base, name: value + "\x00"}).encode(), 400, "bad_request", name)
    for name, (status, code, word) in case["missing"].items():
        content = (
            b""
            if name == "(no body)"
            else json.dumps({k: v for k, v in base.items() if k != name}).encode()
        )
        expect(content, status, code, word)
    assert not problems, "\n".join(problems)
    assert rc.anon.get("/healthz").json() == {"status": "ok", "leader": True}
    # Still serving the real thing: a valid body on the same route is not refused.
    r = c.post(path, json=base)
    assert r.status_code < 500 and r.status_code not in (400, 401, 403, 413), (
        r.status_code,
        r.text,
    )


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"command": ["true", "a\x00b"]}, "command.1"),
        ({"command": ["true"], "env": {"K": "v\x00"}}, "env.K"),
        ({"command": ["true"], "env": {"K\x00": "v"}}, "env.K\x00"),
        ({"command": ["true"], "cwd": "/tmp/\x00"}, "cwd"),
    ],
)
def test_a_nul_character_anywhere_in_a_body_is_400_naming_where(
    rc: Harness, body: dict[str, Any], where: str
) -> None:
    r = rc.client.post("/v1/jobs", json={"device_id": "gpubox:gpu0", "submitter": "al", **body})
    message = assert_error(r, 400, "bad_request")
    assert message.startswith(f"{where}: ") and "NUL" in message, message
    text = {"command": ["true"], "cwd": "/tmp/\\u0000", "submitter": "al"}
    r = rc.client.post("/v1/jobs", json=text)
    assert r.json()["error"] != "bad_request", r.text  # a backslash and "u0000" are text


@pytest.mark.parametrize("route", sorted(CASES), ids=lambda r: f"{r[0].upper()} {r[1]}")
def test_chunked_body_over_the_cap_is_413(rc: Harness, ids: dict[str, str], route: Any) -> None:
    """No Content-Length to trust: the cap holds while the body streams (EXT-LIMITS-2)."""
    op = ROUTES[route]
    case = CASES[route]
    cap = case.get("cap", limits.BODY_BYTES)
    code = "chunk_too_large" if case.get("raw") else "body_too_large"
    piece = b" " * 65536
    count = cap // len(piece) + 2  # past the cap, and never terminated
    head = _head(fill(route[1], ids), token_for(role_of(op)), "Transfer-Encoding: chunked\r\n")
    status, err = _raw_request(rc, head, [b"%x\r\n%s\r\n" % (len(piece), piece)] * count)
    assert status == 413 and err["error"] == code, (status, err)
    assert rc.anon.get("/healthz").status_code == 200
