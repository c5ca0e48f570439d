"""Duration text: one grammar everywhere, rendered exactly as the worker spec §0 writes it, since
consumers match strings like ``max_runtime exceeded (4h0m0s)``."""

from __future__ import annotations

import math
import re

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_TERM = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class DurationError(ValueError):
    """A duration string did not parse."""


def parse_duration(text: str) -> float:
    """Parse duration text into seconds (float); raise ``DurationError`` on bad input."""
    s = text
    if s in ("0", "+0", "-0"):
        return 0.0
    sign = 1
    if s[:1] in "+-" and s:
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if not s:
        raise DurationError(f"invalid duration {text!r}")
    pos = 0
    total_ns = 0.0
    while pos < len(s):
        m = _TERM.match(s, pos)
        if not m:
            raise DurationError(f"invalid duration {text!r}")
        total_ns += float(m.group(1)) * _UNITS_NS[m.group(2)]
        pos = m.end()
    return sign * total_ns / 1e9


def _trim(num: str) -> str:
    if "." in num:
        num = num.rstrip("0").rstrip(".")
    return num


def render_duration(seconds: float) -> str:
    """Render seconds in the spec's duration text: ``0s``, ``500ms``, ``1m30s``, ``4h0m0s``."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    if ns < 0:
        return "-" + render_duration(-seconds)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return _trim(f"{ns / size:.9f}") + unit
    hours, rem = divmod(ns, 3_600_000_000_000)
    minutes, rem = divmod(rem, 60_000_000_000)
    secs = _trim(f"{rem / 1e9:.9f}")
    out = ""
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + f"{secs}s"


def round_half_away(x: float) -> int:
    """Round to the nearest integer, halves away from zero."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def compact(seconds: int) -> str:
    """Compact whole-second duration for tables: ``15s``, ``2m5s``, ``25h1m1s``."""
    if seconds < 0:
        return "-" + compact(-seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60}m{seconds % 60}s"


def age(seconds: int | None) -> str:
    """Human age from a controller-computed number of seconds."""
    if seconds is None:
        return "age unknown (controller may be out of date)"
    m = abs(seconds)
    if m < 60:
        mag = f"{m}s"
    elif m < 3600:
        mag = f"{m // 60}m"
    elif m < 86400:
        mag = f"{m // 3600}h"
    elif m < 30 * 86400:
        mag = f"{m // 86400}d"
    else:
        mag = f"{m // 2592000}mo"
    return f"{mag} ago" if seconds >= 0 else f"{mag} in the future (clock skew?)"
