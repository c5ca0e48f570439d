"""The reference implementation's captured HTTP exchanges (/work/shared/interop, read-only).

Located beside the repository: the first ``shared/interop`` found walking up from this
file (``<repo>/../shared/interop`` for a checkout, also found from a worktree nested one
level deeper), or ``RC_INTEROP_DIR`` when set. Tests that need the capture skip with a
reason when it is absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


def _locate() -> Path:
    if os.environ.get("RC_INTEROP_DIR"):
        return Path(os.environ["RC_INTEROP_DIR"])
    here = Path(__file__).resolve()
    for parent in here.parents[2:]:
        candidate = parent / "shared" / "interop"
        if candidate.is_dir():
            return candidate
    return here.parents[2] / ".." / "shared" / "interop"


INTEROP = _locate()
SESSION = "reference-worker-session.jsonl"
BARE_DEVICES = "reference-worker-register-bare-devices.jsonl"


def exchanges(name: str) -> list[dict[str, Any]]:
    """The exchanges of one capture file, in order; skips the test when it is absent."""
    path = INTEROP / name
    if not path.is_file():
        pytest.skip(f"interop capture {path} is absent (needs the shared interop folder)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def session() -> list[dict[str, Any]]:
    return exchanges(SESSION)


def bare_devices() -> list[dict[str, Any]]:
    return exchanges(BARE_DEVICES)
