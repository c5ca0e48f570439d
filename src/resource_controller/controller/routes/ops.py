"""The routes beside the API: ``GET /healthz``, ``GET /metrics`` and the dashboard."""

from __future__ import annotations

import asyncio
import logging

from starlette.responses import JSONResponse, Response

from resource_controller.controller import dashboard, metrics
from resource_controller.controller.deps import RouteCall
from resource_controller.store.usage import PairTotals

log = logging.getLogger(__name__)

#: Seconds the store gets to answer a health read before the answer is 503.
HEALTH_BOUND = 5.0


async def healthz(call: RouteCall) -> JSONResponse:
    """No token, like ``GET /``: 200 when the store answers a read, 503 otherwise; with
    whether this controller leads."""
    svc = call.svc
    try:
        async with asyncio.timeout(HEALTH_BOUND):
            await svc.db(svc.store.ping)
    except Exception:
        log.warning("health check: the store did not answer a read", exc_info=True)
        return JSONResponse({"status": "unavailable", "leader": svc.peers.leading}, status_code=503)
    return JSONResponse({"status": "ok", "leader": svc.peers.leading})


async def scrape(call: RouteCall) -> Response:
    """Prometheus text; the state gauges from one grouped read, now."""
    svc = call.svc

    def read() -> tuple[metrics.Counts, list[PairTotals]]:
        # The device-and-submitter pairs active lately, from the usage rollup.
        return svc.store.views.metric_counts(), svc.store.views.usage_pairs(metrics.PAIRS_WITHIN)

    counts, pairs = await svc.db(read)
    body = svc.metrics.render(counts, svc.clock.now(), pairs)
    return Response(body, media_type=metrics.CONTENT_TYPE)


async def index(_: RouteCall) -> Response:
    """The dashboard: one HTML page with its style and script inline (controller-api.md §13)."""
    page = dashboard.page()
    return Response(page.html, media_type="text/html; charset=utf-8", headers=page.headers)
