"""``RC_TEST_TIMINGS`` (``name=seconds,...``): one grammar for ``rc serve`` and ``rc worker``, so a
mistyped entry reads the same error. Production never sets it."""

from __future__ import annotations

import math
from collections.abc import Collection

VARIABLE = "RC_TEST_TIMINGS"


class TestTimingsError(ValueError):
    """The variable is malformed; the message names it and the entry at fault."""

    __test__ = False  # not a test class, whatever pytest's name rule says


def parse(
    text: str | None, known: Collection[str], positive: Collection[str] = ()
) -> dict[str, float]:
    """The overrides in ``text``: known names once, finite numbers ≥ 0 (> 0 for ``positive``: a zero
    interval would spin); an empty entry is refused, more likely a lost name than a wish."""
    if text is None or not text.strip():
        return {}
    entries = text.split(",")
    if len(entries) > 1 and not entries[-1].strip():
        entries.pop()
    found: dict[str, float] = {}
    for entry in entries:
        name, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or not name:
            raise TestTimingsError(
                f"{VARIABLE}: malformed entry {entry.strip()!r}: it is not name=seconds"
            )
        if name not in known:
            listed = ", ".join(known)
            raise TestTimingsError(f"{VARIABLE}: unknown timing {name!r} (known: {listed})")
        if name in found:
            raise TestTimingsError(f"{VARIABLE}: {name} given twice")
        try:
            seconds = float(value)
        except ValueError:
            raise TestTimingsError(
                f"{VARIABLE}: {name}={value!r} is not a number: it is not seconds >= 0"
            ) from None
        if not math.isfinite(seconds) or seconds < 0 or (name in positive and seconds == 0):
            least = "positive" if name in positive else "non-negative"
            raise TestTimingsError(
                f"{VARIABLE}: {name} must be a finite {least} number: "
                f"{name}={value!r} is not seconds {'> 0' if name in positive else '>= 0'}"
            )
        found[name] = seconds
    return found
