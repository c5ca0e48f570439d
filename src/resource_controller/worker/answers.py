"""Reading the controller's answers: what failed to arrive, and how to say so.

Shared by the agent and the outbox so that "no answer" means the same thing in both:
a request that got no HTTP response (refused, reset, timed out) is a transport error
and is not contact (WRK-032); any response, 500 included, is.
"""

from __future__ import annotations

import json

import httpx

#: Everything that means "no HTTP answer came back".
TRANSPORT_ERRORS = (httpx.HTTPError, httpx.InvalidURL, TimeoutError, OSError)


def status_line(resp: httpx.Response) -> str:
    """``404 Not Found``: how a refusal is named in messages (WRK-045)."""
    return f"{resp.status_code} {resp.reason_phrase}".strip()


def error_text(exc: BaseException) -> str:
    """A transport error in one line; a bare timeout says so rather than nothing."""
    if isinstance(exc, TimeoutError):
        return "request timed out"
    return str(exc) or type(exc).__name__


def error_body(resp: httpx.Response) -> tuple[str, str]:
    """The ``{"error": code, "message": text}`` of an error answer; blanks when absent."""
    try:
        data = json.loads(resp.content)
    except ValueError:
        return "", ""
    if not isinstance(data, dict):
        return "", ""
    code, message = data.get("error", ""), data.get("message", "")
    return (code if isinstance(code, str) else ""), (message if isinstance(message, str) else "")
