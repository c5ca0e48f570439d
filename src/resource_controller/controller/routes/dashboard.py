"""``GET /``: the dashboard page, no token required."""

from __future__ import annotations

from starlette.responses import Response

from resource_controller.controller import dashboard
from resource_controller.controller.deps import Call


async def index(_: Call) -> Response:
    """The dashboard: one HTML page with its style and script inline (controller-api.md §13)."""
    page = dashboard.page()
    return Response(page.html, media_type="text/html; charset=utf-8", headers=page.headers)
