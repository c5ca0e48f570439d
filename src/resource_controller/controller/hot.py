"""The per-job routes served straight from ASGI, in front of the framework.

A job's life is a handful of requests (submit, the worker's long poll, its status
reports, heartbeats, output, the client's reads), and on each the framework's routing
table walk, dependency solving and middleware layers cost several times what the
route itself does. ``HotRoutes`` recognises exactly those method and path shapes and
calls the very route functions the framework would (``routes/jobs.py``,
``routes/workers.py``) with a Starlette ``Request``, after the same role check their
dependencies make, in the same order (AUTH-003: authentication before the body). The
answers and error bodies are the app's own (``answers.error_answer``); the request timer
observes the same route templates. Anything else — another method, a
path with an extra or empty segment — goes to the framework unchanged, so 404, 405
and every other route behave exactly as before.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from resource_controller.controller import answers, deps
from resource_controller.controller.deps import Services
from resource_controller.controller.routes import jobs, workers
from resource_controller.core.states import Role

#: A hot route: the services, the request and the one path parameter to an answer.
Handler = Callable[[Services, Request, str], Awaitable[Response]]


async def _submit(svc: Services, request: Request, _: str) -> Response:
    caller = deps.authorize(svc, request.headers.get("authorization"), Role.CLIENT)
    return await jobs.submit(request, svc, caller)


async def _list_jobs(svc: Services, request: Request, _: str) -> Response:
    deps.authorize(svc, request.headers.get("authorization"), Role.CLIENT)
    return await jobs.list_jobs(request, svc)


async def _get_job(svc: Services, request: Request, job_id: str) -> Response:
    deps.authorize(svc, request.headers.get("authorization"), Role.CLIENT)
    return await jobs.get_job(job_id, svc)


async def _status(svc: Services, request: Request, job_id: str) -> Response:
    deps.authorize(svc, request.headers.get("authorization"), Role.WORKER)
    return await workers.status(job_id, request, svc)


async def _append_log(svc: Services, request: Request, job_id: str) -> Response:
    deps.authorize(svc, request.headers.get("authorization"), Role.WORKER)
    return await workers.append_log(job_id, request, svc)


async def _assignments(svc: Services, request: Request, worker_id: str) -> Response:
    deps.authorize(svc, request.headers.get("authorization"), Role.WORKER)
    return await workers.assignments(worker_id, request, svc)


async def _heartbeat(svc: Services, request: Request, worker_id: str) -> Response:
    deps.authorize(svc, request.headers.get("authorization"), Role.WORKER)
    return await workers.heartbeat(worker_id, request, svc)


#: (method, segments after "/v1/", the parameter's index or -1) -> (template, handler).
#: The parameter is one non-empty segment, as the framework's ``{param}`` matches.
_ROUTES: dict[tuple[str, int, str, str], tuple[str, Handler]] = {
    ("POST", 1, "jobs", ""): ("/v1/jobs", _submit),
    ("GET", 1, "jobs", ""): ("/v1/jobs", _list_jobs),
    ("GET", 2, "jobs", ""): ("/v1/jobs/{job_id}", _get_job),
    ("POST", 3, "jobs", "status"): ("/v1/jobs/{job_id}/status", _status),
    ("POST", 3, "jobs", "logs"): ("/v1/jobs/{job_id}/logs", _append_log),
    ("GET", 3, "workers", "assignments"): (
        "/v1/workers/{worker_id}/assignments",
        _assignments,
    ),
    ("POST", 3, "workers", "heartbeat"): ("/v1/workers/{worker_id}/heartbeat", _heartbeat),
}


def match(method: str, path: str) -> tuple[str, Handler, str] | None:
    """The hot route for ``method`` and ``path``: (template, handler, parameter), or None."""
    if not path.startswith("/v1/"):
        return None
    parts = path[4:].split("/")
    n = len(parts)
    if n == 1:
        key = (method, 1, parts[0], "")
        param = ""
    elif n in (2, 3):
        param = parts[1]
        if not param:
            return None
        key = (method, n, parts[0], parts[2] if n == 3 else "")
    else:
        return None
    found = _ROUTES.get(key)
    if found is None:
        return None
    return found[0], found[1], param


class HotRoutes:
    """Serves the hot routes itself; hands every other request to ``app``."""

    def __init__(self, app: ASGIApp, svc: Services) -> None:
        self.app = app
        self.svc = svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = match(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        template, handler, param = found
        started = time.perf_counter()
        try:
            try:
                response = await handler(self.svc, Request(scope, receive), param)
            except Exception as exc:
                response = answers.error_answer(exc)
            await response(scope, receive, send)
        finally:
            self.svc.metrics.http.labels(scope["method"], template).observe(
                time.perf_counter() - started
            )
