"""The dashboard page, with a Content-Security-Policy allowing just its inline parts."""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass
from importlib import resources

STYLE_MARK = "/*STYLE*/"
SCRIPT_MARK = "/*SCRIPT*/"


@dataclass(frozen=True)
class Page:
    html: bytes
    headers: dict[str, str]


def _read(name: str) -> str:
    return (resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return "'sha256-" + base64.b64encode(digest).decode() + "'"


@functools.cache
def page() -> Page:
    """The assembled page and the headers it is served with."""
    template, style, script = _read("dashboard.html"), _read("dashboard.css"), _read("dashboard.js")
    if template.count(STYLE_MARK) != 1 or template.count(SCRIPT_MARK) != 1:
        raise RuntimeError("dashboard.html must hold one style and one script placeholder")
    if "</" in style or "</" in script:
        raise RuntimeError("the dashboard style and script must not contain '</'")
    html = template.replace(STYLE_MARK, style).replace(SCRIPT_MARK, script)
    csp = "; ".join(
        (
            "default-src 'none'",
            f"script-src {_sha256(script)}",
            f"style-src {_sha256(style)}",
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    headers = {
        "Cache-Control": "no-store",  # DASH-001
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    return Page(html.encode(), headers)
