"""``create_app``: the controller's HTTP surface, error mapping and background loops.

Errors are mapped to the wire in one place: every ``RcError`` becomes the spec's
``{"error", "message"}`` body with its status; anything unexpected is a generic
``500 store_error`` that leaks no driver text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from resource_controller import errors
from resource_controller.controller import answers, hot, loops, metrics, openapi, render, webhooks
from resource_controller.controller.answers import error_response
from resource_controller.controller.deps import Services
from resource_controller.controller.routes import (
    dashboard,
    events,
    fleet,
    jobs,
    ops,
    tty,
    workers,
)

log = logging.getLogger(__name__)


class InstanceHeader:
    """Stamps ``Rc-Controller-Instance`` on every response, errors and 404s included."""

    def __init__(self, app: ASGIApp, instance: str) -> None:
        self.app = app
        self.header = (b"rc-controller-instance", instance.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, stamped)


class CatchAll:
    """Answers an unexpected exception with the generic ``500 store_error``.

    Starlette's catch-all handler answers too, but then re-raises to the server, which
    resets the keep-alive connection under the client's next request. Caught here, the
    500 is an ordinary response. An exception after the response started still propagates.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            if started or scope["type"] != "http":
                raise
            log.exception("unhandled error in a route")
            await error_response("store_error", "internal error", 500)(scope, receive, send)


def create_app(svc: Services, *, run_loops: bool = True) -> FastAPI:
    """Build the ASGI app around ``svc``; ``run_loops`` starts the reaper and scheduler loops."""

    async def device_views() -> list[Any]:
        """The list ``GET /v1/devices`` answers, for a "devices" event."""
        snaps = await svc.db(svc.store.views.devices)
        now = svc.now()
        return [render.device_view_body(s, now) for s in snaps]

    svc.hub.events.devices_source = device_views

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = []
        if svc.settings.webhook_url:  # No URL, no queue and no task
            svc.hub.notifier = webhooks.Notifier(svc.settings.webhook_url, svc.metrics)
            svc.hub.notifier.start()
        if run_loops:
            # The start instant and the hold-off, fixed once, before the loops.
            started = svc.clock.now()
            hold_off_until = started + svc.settings.hold_off
            tasks = [
                asyncio.create_task(loops.reaper(svc, started, hold_off_until), name="reaper"),
                asyncio.create_task(loops.scheduler(svc), name="scheduler"),
            ]
        # A stop signal ends every relay stream at once, so none holds the graceful
        # shutdown window open (TTY-002: sessions do not outlive the process).
        tasks.append(asyncio.create_task(_end_relay_at_shutdown(svc), name="relay-stop"))
        if not svc.peers.alone:
            tasks.append(asyncio.create_task(svc.peers.run(svc.hub), name="peers"))
        if svc.settings.limits_file:  # SIGHUP reads it again
            tasks.append(asyncio.create_task(loops.limits_on_hangup(svc), name="limits"))
        try:
            yield
        finally:
            svc.hub.shutting_down.set()
            svc.hub.relay.close_all()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # After requests and loops stopped, before the store closes.
            if svc.hub.notifier is not None:
                await svc.hub.notifier.close()

    app = FastAPI(
        title="resource-controller",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        # A path that matches no route is a 404, never a redirect to another path.
        redirect_slashes=False,
    )
    app.state.services = svc
    app.add_middleware(CatchAll)
    app.add_middleware(metrics.RequestTimer, metrics=svc.metrics)  # EXT-METRICS-1
    for router in (
        workers.router,
        jobs.router,
        fleet.router,
        events.router,
        ops.router,
        tty.router,
        dashboard.router,
    ):
        app.include_router(router)

    published: list[str] = []

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json(request: Request) -> Response:
        from resource_controller.controller.deps import require
        from resource_controller.core.states import Role

        await require(Role.CLIENT)(request)
        if not published:
            published.append(json.dumps(openapi.document(app)))  # EXT-LIMITS-5
        return Response(published[0], media_type="application/json")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            # The Allow header names every method of the path, not only the
            # methods of the first route that matched it.
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(_allowed(app, request))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(errors.RcError)
    async def rc_error(_: Request, exc: errors.RcError) -> JSONResponse:
        return answers.rc_error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response("bad_request", "the request is malformed", 400)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        return answers.unexpected()

    return app


async def _end_relay_at_shutdown(svc: Services) -> None:
    await svc.hub.shutting_down.wait()
    svc.hub.relay.close_all()


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed(app: FastAPI, request: Request) -> list[str]:
    """Every method some route fully matches on this request's path, sorted."""
    allowed = []
    for method in _METHODS:
        probe: Scope = {
            "type": "http",
            "path": request.scope["path"],
            "root_path": request.scope.get("root_path", ""),
            "method": method,
        }
        if any(route.matches(probe)[0] == Match.FULL for route in app.router.routes):
            allowed.append(method)
    return allowed


def wrap(app: FastAPI, svc: Services) -> Any:
    """The ASGI callable to serve: the hot routes in front of the app (``hot.py``), both
    behind the instance-header stamp."""
    return InstanceHeader(hot.HotRoutes(app, svc), svc.instance)
