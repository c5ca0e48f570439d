"""Answers as the wire has them: JSON bodies of the response models, and errors as the
``{"error", "message"}`` bodies, so every route answers a failure the same way."""

from __future__ import annotations

import logging

import pydantic
from starlette.responses import JSONResponse, Response

from resource_controller import errors

log = logging.getLogger("resource_controller.controller.app")

JSON = "application/json"


def json(model: pydantic.BaseModel, status: int = 200) -> Response:
    """A response model as its JSON body, its omitted (None) fields left out."""
    return Response(model.model_dump_json(exclude_none=True), status_code=status, media_type=JSON)


def error_response(code: str, message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def unexpected() -> JSONResponse:
    """Anything unforeseen: logged with its traceback, answered without driver text."""
    log.exception("unhandled error in a route")
    return error_response("store_error", "internal error", 500)


def error_answer(exc: Exception) -> JSONResponse:
    """The answer to ``exc``, raised by a route: its own code, or the generic 500."""
    if not isinstance(exc, errors.RcError):
        return unexpected()
    if exc.status >= 500:
        log.error("request failed: %s", exc.message)
    return error_response(exc.code, exc.message, exc.status)
