"""The crash trial's store checks find half-applied changes (so its passes mean something)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from support.crashrun import inconsistencies

SCHEMA = """
CREATE TABLE jobs (id TEXT, state TEXT, device_id TEXT, started_at INT, finished_at INT);
CREATE TABLE leases (id TEXT, device_id TEXT, job_id TEXT, released_at INT);
CREATE TABLE devices (id TEXT, state TEXT);
"""


def db(tmp: Path, *rows: str) -> Path:
    path = tmp / "rc.db"
    with contextlib.closing(sqlite3.connect(path)) as c:
        c.executescript(SCHEMA + ";".join(rows))
        c.commit()
    return path


def test_a_consistent_store_passes(tmp_path: Path) -> None:
    path = db(
        tmp_path,
        "INSERT INTO devices VALUES ('h:gpu0', 'busy'), ('h:gpu1', 'ready')",
        "INSERT INTO jobs VALUES ('j1', 'running', 'h:gpu0', 5, NULL)",
        "INSERT INTO jobs VALUES ('j0', 'succeeded', 'h:gpu1', 1, 4), ('j2', 'queued', '', NULL, NULL)",
        "INSERT INTO leases VALUES ('l1', 'h:gpu0', 'j1', NULL), ('l0', 'h:gpu1', 'j0', 4)",
    )
    assert inconsistencies(path) == []


def test_half_applied_grants_and_releases_are_found(tmp_path: Path) -> None:
    path = db(
        tmp_path,
        # A grant that flipped the device but wrote no lease; a release that ended the
        # job but left its lease live on a ready device.
        "INSERT INTO devices VALUES ('h:gpu0', 'busy'), ('h:gpu1', 'ready')",
        "INSERT INTO jobs VALUES ('j1', 'assigned', 'h:gpu0', 5, NULL)",
        "INSERT INTO jobs VALUES ('j2', 'succeeded', 'h:gpu1', 1, 4)",
        "INSERT INTO leases VALUES ('l2', 'h:gpu1', 'j2', NULL)",
    )
    found = inconsistencies(path)
    assert any("busy without a live lease" in f for f in found)
    assert any("assigned job j1 has 0 live leases" in f for f in found)
    assert any("live lease l2 on ready device" in f for f in found)
    assert any("live lease l2 for job j2" in f for f in found)
