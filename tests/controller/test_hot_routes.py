"""The per-job routes served in front of the framework (``controller/hot.py``) answer
exactly as the framework's own routes do: same statuses, headers and bodies, errors
included (API-002, AUTH-003), and each names a route the app itself has."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from controller_harness import route_pairs
from fastapi import FastAPI

from resource_controller.clock import FakeClock
from resource_controller.controller import app as app_module
from resource_controller.controller import hot, serve
from resource_controller.controller.deps import Services, Settings
from resource_controller.store.jobs import NewJob

TOKENS = "wtok:worker,ctok:client,atok:admin"
Sent = list[tuple[str, Any, Any, Any]]


def _scope(method: str, path: str, query: bytes, token: bytes, size: int) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"authorization", b"Bearer " + token), (b"content-length", b"%d" % size)],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "root_path": "",
    }


async def _call(app: Any, method: str, path: str, body: bytes, query: bytes, token: bytes) -> Sent:
    """One request straight into ``app``: every message it sends, headers sorted."""
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(method, path, query, token, len(body)), receive, send)
    return [(m["type"], m.get("status"), sorted(m.get("headers", [])), m.get("body")) for m in sent]


@pytest.fixture
def services(tmp_path: Path) -> Services:
    svc = serve.open_services(tmp_path / "data", TOKENS, Settings(), FakeClock(1_800_000_000.0))
    svc.store.devices.register("h", "boot", [("d0", 0)])
    return svc


def test_every_hot_route_is_a_route_of_the_app(services: Services) -> None:
    app = app_module.create_app(services, run_loops=False)
    assert isinstance(app, FastAPI)
    routes = route_pairs(app)
    assert {(k[0], template) for k, (template, _) in hot._ROUTES.items()} <= routes


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/"),  # an empty parameter is not the route
        ("GET", "/v1/jobs/a/b/c"),
        ("PUT", "/v1/jobs"),
        ("GET", "/v2/jobs"),
        ("DELETE", "/v1/jobs/x/status"),
        ("GET", "/v1/jobs/x/logs"),  # the client's log read is the framework's
    ],
)
def test_other_shapes_go_to_the_framework(method: str, path: str) -> None:
    assert hot.match(method, path) is None


CASES = [
    ("POST", "/v1/jobs", b'{"command":["true"],"submitter":"a","device_id":"h:d9"}', b"", b"ctok"),
    ("POST", "/v1/jobs", b'{"command":[],"submitter":"a"}', b"", b"ctok"),
    ("POST", "/v1/jobs", b'{"command":"x"}', b"", b"ctok"),
    ("POST", "/v1/jobs", b"nope", b"", b"ctok"),
    ("POST", "/v1/jobs", b"{}", b"", b"wtok"),
    ("POST", "/v1/jobs", b"{}", b"", b"bad"),
    ("POST", "/v1/jobs", b"x" * 70000, b"", b"ctok"),
    ("GET", "/v1/jobs", b"", b"state=queued&limit=1", b"ctok"),
    ("GET", "/v1/jobs", b"", b"limit=0", b"ctok"),
    ("GET", "/v1/jobs", b"", b"state=nope", b"ctok"),
    ("GET", "/v1/jobs", b"", b"", b"wtok"),
    ("GET", "/v1/jobs/nope", b"", b"", b"ctok"),
    ("GET", "/v1/jobs/nope", b"", b"", b"wtok"),
    ("GET", "/v1/jobs/nope", b"", b"", b""),
    ("POST", "/v1/jobs/nope/status", b'{"worker_id":"w","state":"running"}', b"", b"wtok"),
    ("POST", "/v1/jobs/nope/status", b'{"worker_id":1}', b"", b"wtok"),
    ("POST", "/v1/jobs/nope/status", b"{}", b"", b"ctok"),
    ("POST", "/v1/jobs/nope/logs", b"abc", b"lease_epoch=1", b"wtok"),
    ("POST", "/v1/workers/nope/heartbeat", b'{"running_job_ids":[]}', b"", b"wtok"),
    ("POST", "/v1/workers/nope/heartbeat", b'{"running_job_ids":[1]}', b"", b"wtok"),
    ("GET", "/v1/workers/nope/assignments", b"", b"wait=0.01s", b"wtok"),
    ("GET", "/v1/workers/nope/assignments", b"", b"wait=0.01s", b"atok"),
]


@pytest.mark.parametrize(("method", "path", "body", "query", "token"), CASES)
def test_the_hot_path_answers_as_the_framework_does(
    services: Services, method: str, path: str, body: bytes, query: bytes, token: bytes
) -> None:
    # The same answers, refusals first: auth before the body (AUTH-003), then the
    # body's own errors, then the store's.
    app = app_module.create_app(services, run_loops=False)
    plain = app_module.InstanceHeader(app, services.instance)
    served = app_module.wrap(app, services)
    assert hot.match(method, path) is not None
    framework = asyncio.run(_call(plain, method, path, body, query, token))
    fast = asyncio.run(_call(served, method, path, body, query, token))
    assert fast == framework


def test_a_job_read_and_a_status_report_answer_alike(services: Services) -> None:
    job = services.store.queue.enqueue(NewJob(command=["true"], submitter="a"))
    services.store.queue.run_pass()
    app = app_module.create_app(services, run_loops=False)
    plain = app_module.InstanceHeader(app, services.instance)
    served = app_module.wrap(app, services)
    for target in (plain, served):
        view = asyncio.run(_call(target, "GET", f"/v1/jobs/{job.id}", b"", b"", b"ctok"))
        assert view[0][1] == 200 and b'"state":"assigned"' in view[1][3]
    read = [
        asyncio.run(_call(t, "GET", f"/v1/jobs/{job.id}", b"", b"", b"ctok"))
        for t in (plain, served)
    ]
    assert read[0] == read[1]
    report = (
        b'{"worker_id":"%s","state":"running"}'
        % services.store.views.job(job.id).worker_id.encode()
    )
    answers = [
        asyncio.run(_call(t, "POST", f"/v1/jobs/{job.id}/status", report, b"", b"wtok"))
        for t in (plain, served)
    ]
    assert answers[0] == answers[1] and answers[0][0][1] == 200
