"""``GET /``: the dashboard page, no token required."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from resource_controller.controller import dashboard

router = APIRouter()


@router.get("/")
async def index() -> Response:
    """The dashboard: one HTML page with its style and script inline (controller-api.md §13)."""
    page = dashboard.page()
    return Response(page.html, media_type="text/html; charset=utf-8", headers=page.headers)
