"""Errors as the wire's ``{"error", "message"}`` bodies, for the app's handlers and the
hot routes alike, so both answer a failure the same way."""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse

from resource_controller import errors

log = logging.getLogger("resource_controller.controller.app")


def error_response(code: str, message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def rc_error(exc: errors.RcError) -> JSONResponse:
    if exc.status >= 500:
        log.error("request failed: %s", exc.message)
    return error_response(exc.code, exc.message, exc.status)


def unexpected() -> JSONResponse:
    """Anything unforeseen: logged with its traceback, answered without driver text."""
    log.exception("unhandled error in a route")
    return error_response("store_error", "internal error", 500)


def error_answer(exc: Exception) -> JSONResponse:
    """The answer the app's exception handlers give for ``exc`` (raised by a route)."""
    if isinstance(exc, errors.RcError):
        return rc_error(exc)
    return unexpected()
