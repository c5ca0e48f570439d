"""``create_app``: one ASGI app serving ``controller/table.py``'s routes, authenticating first
(AUTH-003); a non-``RcError`` is ``500 store_error`` with no driver text."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Router
from starlette.types import Message, Receive, Scope, Send

from resource_controller.controller import answers, deps, loops, render, table, webhooks
from resource_controller.controller.deps import Route, RouteCall, Services

log = logging.getLogger(__name__)


class App:
    """The ASGI app: every request through the route table, the lifespan running the loops."""

    def __init__(self, svc: Services, routes: Sequence[Route], run_loops: bool) -> None:
        self.svc = svc
        self.table = table.Table(routes)
        self.run_loops = run_loops
        self.header = (b"rc-controller-instance", svc.instance.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":  # Starlette's router speaks the protocol
            await Router(lifespan=lambda _: self.running()).lifespan(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        method = scope["method"]
        found = self.table.find(method, scope["path"])
        begun = False

        async def stamped(message: Message) -> None:
            nonlocal begun
            if message["type"] == "http.response.start":
                begun = True
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        try:
            response = await self._answer(found, scope, receive)
            try:
                await response(scope, receive, stamped)
            except Exception:
                if begun:
                    raise
                await answers.unexpected()(scope, receive, stamped)
        finally:
            if found.route is not None:
                template = found.route.path
            else:  # a 405 is timed under its path's template
                template = found.others[0].path if found.others else "unmatched"
            self.svc.metrics.http.labels(method, template).observe(time.perf_counter() - started)

    async def _answer(self, found: table.Found, scope: Scope, receive: Receive) -> Response:
        route = found.route
        if route is None:
            if not found.others:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            # The Allow header names every method of the path (AUTH-030).
            allow = ", ".join(sorted({r.method for r in found.others}))
            return JSONResponse(
                {"detail": "Method Not Allowed"}, status_code=405, headers={"Allow": allow}
            )
        svc = self.svc
        request = Request(scope, receive)
        try:
            caller = None
            if route.role is not None:
                fallback = request.query_params.get("token", "") if route.query_token else ""
                header = request.headers.get("authorization")
                caller = deps.authorize(svc, header, route.role, fallback)
            body = None
            if route.body is not None:
                raw = await deps.read_capped(request, route.body_cap, route.body_what)
                body = deps.parse_model(raw, route.body, empty_ok=not route.body_required)
            return await route.handler(RouteCall(svc, request, caller, found.param, body))
        except Exception as exc:
            return answers.error_answer(exc)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The webhook notifier and the background tasks, for as long as the app serves."""
        svc = self.svc
        tasks = []
        if svc.settings.webhook_url:  # No URL, no queue and no task
            svc.hub.notifier = webhooks.Notifier(svc.settings.webhook_url, svc.metrics)
            svc.hub.notifier.start()
        if self.run_loops:
            # The start instant and the hold-off, fixed once, before the loops.
            started = svc.clock.now()
            hold_off_until = started + svc.settings.hold_off
            tasks = [
                asyncio.create_task(loops.reaper(svc, started, hold_off_until), name="reaper"),
                asyncio.create_task(loops.scheduler(svc), name="scheduler"),
            ]
        # A stop ends every relay stream at once (TTY-002: sessions do not outlive the process).
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


def create_app(svc: Services, *, run_loops: bool = True) -> App:
    """Build the ASGI app around ``svc``; ``run_loops`` starts the reaper and scheduler loops."""

    async def device_views() -> list[Any]:
        """The list ``GET /v1/devices`` answers, for a "devices" event."""
        snaps = await svc.db(svc.store.views.devices)
        now = svc.now()
        return [render.device_view_body(s, now) for s in snaps]

    svc.hub.events.devices_source = device_views
    return App(svc, table.ROUTES, run_loops)


async def _end_relay_at_shutdown(svc: Services) -> None:
    await svc.hub.shutting_down.wait()
    svc.hub.relay.close_all()
