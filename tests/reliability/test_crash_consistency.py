"""Crash consistency: ``rc serve`` dies at each write path, restarts and has lost nothing.

Each write path once, at alternating sides of its commit (every point, many times
each, is ``bench/crash.py``). Real processes, a real SQLite file, ``os._exit`` at the
point: see ``support.crashrun``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resource_controller import crashpoints
from support import crashrun

pytestmark = pytest.mark.e2e

PATHS = [*crashpoints.TRANSACTIONS, "log_append"]
SIDES = {
    "log_append": ("before_write", "after_write"),
}


def _point(i: int, path: str) -> str:
    before, after = SIDES.get(path, ("before_commit", "after_commit"))
    return f"{path}.{before if i % 2 == 0 else after}"


# Later rounds for some (n = 2) so a crash also lands after earlier acknowledged rounds.
CASES = [(_point(i, p), 1 + i % 3 // 2) for i, p in enumerate(PATHS)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("point", "n"), CASES, ids=[f"{p}:{n}" for p, n in CASES])
def test_a_crash_at_a_write_path_loses_nothing_acknowledged(
    point: str, n: int, tmp_path: Path
) -> None:
    outcome = crashrun.trial(point, n, tmp_path)
    log = (tmp_path / "controller.log").read_text(errors="replace")[-3000:]
    assert outcome.crashed, log
    assert f"crashing at {point}" in log
    assert outcome.integrity == "ok"
    assert outcome.problems == [], log
