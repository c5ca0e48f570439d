"""Timestamps and durations, apart so ``rc run`` never imports ``datetime``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from resource_controller.core import durations


def utc_now() -> datetime:
    """The local clock, in UTC: used only for the durations of unfinished jobs."""
    return datetime.now(UTC)


def parse(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the controller; ``None`` when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def rfc3339(moment: datetime) -> str:
    """UTC, second precision, ``Z`` suffix."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def compact_between(start: datetime, end: datetime) -> str:
    """``end - start`` rounded to whole seconds, halves away from zero, compact."""
    return durations.compact(durations.round_half_away((end - start).total_seconds()))
