"""Every route against every kind of caller, over real HTTP (AUTH-001..004, EXT-WHO-3).

The routes come from the served app itself and are checked against this file's own
table (written from controller-api.md §4 and extensions.md) and against the route
table's roles (``controller/table.py``): a route added without a matrix entry fails here. Each route is
called with no token, an unknown token, each role's token and a named worker token of
another host, on path parameters that exist and ones that do not, and with a valid
token in ``?token=`` instead of the header (only ``GET /v1/events`` may accept it).
Streaming answers are judged by their status line and dropped.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from controller_harness import ADMIN, CLIENT, QUIET, ROUTES, START, TOKENS, WORKER, Harness, role_of

from resource_controller.clock import FakeClock
from resource_controller.controller import app as app_module
from resource_controller.controller import serve
from support.served import ServedController

#: A worker token that may speak only for the host "otherhost" (EXT-WHO-3).
OTHER_HOST_WORKER = "nwtok-otherhost"
BAD = "nope-not-a-token"

#: (method, path) -> the role it needs, from the spec's route table (controller-api.md §4,
#: EXT-METRICS-1/3, EXT-DRAIN-3a, README's OpenAPI note). "none": no token at all.
EXPECTED: dict[tuple[str, str], str] = {
    ("POST", "/v1/workers/register"): "worker",
    ("POST", "/v1/workers/{worker_id}/labels"): "worker",
    ("GET", "/v1/workers/{worker_id}/assignments"): "worker",
    ("POST", "/v1/workers/{worker_id}/heartbeat"): "worker",
    ("POST", "/v1/jobs/{job_id}/logs"): "worker",
    ("POST", "/v1/jobs/{job_id}/status"): "worker",
    ("POST", "/v1/devices/{device_id}/fault"): "worker",
    ("POST", "/v1/jobs/{job_id}/tty/out"): "worker",
    ("GET", "/v1/jobs/{job_id}/tty/in"): "worker",
    ("POST", "/v1/jobs"): "client",
    ("GET", "/v1/jobs"): "client",
    ("GET", "/v1/jobs/{job_id}"): "client",
    ("GET", "/v1/arrays/{array_id}"): "client",
    ("POST", "/v1/jobs/{job_id}/kill"): "client",
    ("GET", "/v1/jobs/{job_id}/logs"): "client",
    ("GET", "/v1/jobs/{job_id}/tty/out"): "client",
    ("POST", "/v1/jobs/{job_id}/tty/in"): "client",
    ("GET", "/v1/devices"): "client",
    ("GET", "/v1/devices/{device_id}/describe"): "client",
    ("GET", "/v1/explain"): "client",
    ("GET", "/v1/state"): "client",
    ("GET", "/v1/events"): "client",
    ("GET", "/v1/whoami"): "client",
    ("GET", "/v1/usage"): "client",  # EXT-ACCT-2
    ("GET", "/metrics"): "client",
    ("GET", "/openapi.json"): "client",
    ("POST", "/v1/devices/{device_id}/clear"): "admin",
    ("POST", "/v1/devices/{device_id}/drain"): "admin",
    ("POST", "/v1/devices/{device_id}/undrain"): "admin",
    ("DELETE", "/v1/devices/{device_id}"): "admin",
    ("GET", "/"): "none",
    ("GET", "/healthz"): "none",
}

#: What each call sends besides its token: a body or query that is valid, so an
#: accepted caller reaches the handler itself (a 400 would hide nothing, but a valid
#: request exercises more of it).
REQUESTS: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v1/workers/register"): {"json": {"host": "gpubox", "devices": [{"name": "gpu0"}]}},
    ("POST", "/v1/workers/{worker_id}/labels"): {"json": {}},
    ("GET", "/v1/workers/{worker_id}/assignments"): {"params": {"wait": "10ms"}},
    ("POST", "/v1/workers/{worker_id}/heartbeat"): {"json": {}},
    ("POST", "/v1/jobs/{job_id}/logs"): {"content": b"out\n"},
    ("POST", "/v1/jobs/{job_id}/status"): {"json": {"worker_id": "", "state": "running"}},
    ("POST", "/v1/devices/{device_id}/fault"): {"json": {"reason": "matrix"}},
    ("POST", "/v1/jobs/{job_id}/tty/out"): {"content": b""},
    ("POST", "/v1/jobs"): {
        "json": {"command": ["true"], "submitter": "alice", "device_id": "gpubox:gpu1"}
    },
    ("POST", "/v1/jobs/{job_id}/kill"): {"json": {"submitter": "alice"}},
    ("GET", "/v1/jobs/{job_id}/logs"): {"params": {"follow": "false"}},
    ("POST", "/v1/jobs/{job_id}/tty/in"): {"content": b""},
    ("GET", "/v1/explain"): {"params": {"selector": "gpu0"}},
    ("POST", "/v1/devices/{device_id}/drain"): {"json": {"reason": "matrix"}},
}

#: Routes whose rule also depends on the token's name: register under a named worker
#: token of another host is 403 forbidden (EXT-WHO-3).
NAMED_HOST_ROUTES = {("POST", "/v1/workers/register")}


@dataclass(frozen=True)
class Caller:
    label: str
    token: str | None
    #: The roles this caller satisfies (AUTH-002: admin satisfies all).
    roles: frozenset[str]


CALLERS = (
    Caller("none", None, frozenset()),
    Caller("bad", BAD, frozenset()),
    Caller("client", CLIENT, frozenset({"client"})),
    Caller("worker", WORKER, frozenset({"worker"})),
    Caller("admin", ADMIN, frozenset({"worker", "client", "admin"})),
    Caller("other-host-worker", OTHER_HOST_WORKER, frozenset({"worker"})),
)


@pytest.fixture
def rc(tmp_path: Path) -> Iterator[Harness]:
    """The harness controller, with a named worker token for "otherhost" added."""
    clock = FakeClock(START)
    tokens = f"{TOKENS},{OTHER_HOST_WORKER}:worker:otherhost"
    svc = serve.open_services(tmp_path / "data", tokens, QUIET, clock)
    server = ServedController(svc)
    server.start()
    h = Harness(server, clock, tmp_path / "data")
    try:
        yield h
    finally:
        h.close()


def app_routes(rc: Harness) -> set[tuple[str, str]]:
    """(method, path) of every route the served app answers."""
    app = rc.server.server.config.app
    assert isinstance(app, app_module.App), app
    return {(r.method, r.path) for r in app.table.routes}


def test_the_matrix_names_every_route_and_agrees_with_openapi(rc: Harness) -> None:
    routes = app_routes(rc)
    assert routes == set(EXPECTED), (
        f"routes without a matrix entry: {sorted(routes - set(EXPECTED))}; "
        f"matrix entries the app lacks: {sorted(set(EXPECTED) - routes)}"
    )
    published = {(m.upper(), p): role_of(op) for (m, p), op in ROUTES.items()}
    assert published == EXPECTED
    assert set(REQUESTS) <= set(EXPECTED)


def fill(path: str, ids: dict[str, str]) -> str:
    for name, value in ids.items():
        path = path.replace("{" + name + "}", value)
    assert "{" not in path, path
    return path


def call(
    rc: Harness, method: str, url: str, token: str | None, extra: dict[str, Any]
) -> tuple[int, dict[str, Any] | None]:
    """Status and (for a JSON answer) the body; a streaming answer is closed at once."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with (
        # A fresh connection per call, so a dropped stream cannot spoil the next one;
        # plain HTTP, so no TLS context is built for it.
        httpx.Client(base_url=rc.url, timeout=10, verify=False) as c,
        c.stream(method, url, headers=headers, **extra) as r,
    ):
        body = None
        if r.headers.get("content-type", "").startswith("application/json"):
            r.read()
            body = r.json()
        return r.status_code, body


def expected_status(route: tuple[str, str], caller: Caller) -> int | None:
    """401 or 403 where the spec says so; ``None``: anything but 401/403/5xx."""
    role = EXPECTED[route]
    if role == "none":
        return None
    if caller.token is None or not caller.roles:
        return 401
    if role not in caller.roles:
        return 403
    if caller.label == "other-host-worker" and route in NAMED_HOST_ROUTES:
        return 403
    return None


def test_every_route_with_every_caller(rc: Harness) -> None:
    """AUTH-001..003, EXT-WHO-3: 401 without a usable token, 403 for the wrong role, never 5xx."""
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    job_id, _ = rc.running_job("gpubox:gpu0")
    ids_present = {
        "worker_id": wid,
        "job_id": job_id,
        "device_id": "gpubox:gpu1",
        "array_id": job_id,
    }
    ids_missing = {
        "worker_id": "no-such-worker",
        "job_id": str(uuid.uuid4()),
        "device_id": "no:pe",
        "array_id": str(uuid.uuid4()),
    }
    requests = copy.deepcopy(REQUESTS)
    requests[("POST", "/v1/jobs/{job_id}/status")]["json"]["worker_id"] = wid
    checked = 0
    problems: list[str] = []
    # Callers that must be refused go first: they must change nothing either.
    order = sorted(CALLERS, key=lambda c: bool(c.roles))
    for route in sorted(EXPECTED):
        method, template = route
        variants = [ids_present, ids_missing] if "{" in template else [{}]
        for ids in variants:
            url = fill(template, ids)
            for caller in order:
                status, body = call(rc, method, url, caller.token, requests.get(route, {}))
                checked += 1
                want = expected_status(route, caller)
                where = f"{method} {url} as {caller.label}: {status} {body}"
                if status >= 500:
                    problems.append("5xx: " + where)
                elif want is None and status in (401, 403):
                    problems.append("refused: " + where)
                elif want is not None and status != want:
                    problems.append(f"want {want}: " + where)
                elif want is not None:
                    code = "unauthorized" if want == 401 else "forbidden"
                    if body is None or body.get("error") != code:
                        problems.append(f"want error {code}: " + where)
                    elif want == 403 and route not in NAMED_HOST_ROUTES:
                        # AUTH-003: the message names the token's role and the route's.
                        msg = str(body.get("message", ""))
                        if EXPECTED[route] not in msg:
                            problems.append("403 message lacks the route's role: " + where)
    print(f"role matrix: {checked} calls over {len(EXPECTED)} routes x {len(CALLERS)} callers")
    assert not problems, "\n".join(problems)
    assert rc.anon.get("/healthz").status_code == 200


def test_a_query_token_authenticates_only_the_event_stream(rc: Harness) -> None:
    """AUTH-004: ``?token=`` with no header opens /v1/events and nothing else."""
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    job_id, _ = rc.running_job("gpubox:gpu0")
    ids = {"worker_id": wid, "job_id": job_id, "device_id": "gpubox:gpu1", "array_id": job_id}
    problems = []
    for route, role in sorted(EXPECTED.items()):
        method, template = route
        extra = dict(REQUESTS.get(route, {}))
        for token in (CLIENT, WORKER, ADMIN):
            params = {**extra.get("params", {}), "token": token}
            status, body = call(rc, method, fill(template, ids), None, {**extra, "params": params})
            where = f"{method} {template} ?token={token}: {status} {body}"
            if role == "none":
                ok = status < 400
            elif route == ("GET", "/v1/events"):
                ok = status == (403 if token == WORKER else 200)
            else:
                ok = status == 401 and body is not None and body["error"] == "unauthorized"
            if not ok:
                problems.append(where)
    assert not problems, "\n".join(problems)
    # A header with a non-empty token always wins over the query (AUTH-004).
    status, _ = call(rc, "GET", "/v1/events", BAD, {"params": {"token": CLIENT}})
    assert status == 401


#: Authorization headers that carry a valid token but not as ``Bearer <token>`` (AUTH-001).
MALFORMED = (
    ADMIN,
    f"bearer {ADMIN}",
    f"BEARER {ADMIN}",
    f"Basic {ADMIN}",
    f"Bearer  {ADMIN}",
    f"Bearer {ADMIN}x",  # a listed token plus more
    f"Bearer {ADMIN[:-1]}",  # a prefix of a listed token
    f"Bearer {ADMIN},{CLIENT}",
    f"Bearer {ADMIN}:admin",
    "Bearer",  # (a trailing space is not a legal header ending: httpx refuses to send it)
)


def test_a_valid_token_in_a_malformed_header_is_401_everywhere(rc: Harness) -> None:
    """AUTH-001: exactly ``Bearer `` and a listed token; an admin token any other way is 401."""
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    job_id, _ = rc.running_job("gpubox:gpu0")
    ids = {"worker_id": wid, "job_id": job_id, "device_id": "gpubox:gpu1", "array_id": job_id}
    problems = []
    for route, role in sorted(EXPECTED.items()):
        if role == "none":
            continue
        method, template = route
        url = fill(template, ids)
        for header in MALFORMED:
            with httpx.Client(base_url=rc.url, timeout=10, verify=False) as c:
                r = c.request(
                    method, url, headers={"Authorization": header}, **REQUESTS.get(route, {})
                )
            if r.status_code != 401 or r.json().get("error") != "unauthorized":
                problems.append(f"{method} {url} with {header!r}: {r.status_code} {r.text[:120]}")
    assert not problems, "\n".join(problems)
