"""A full disk and a read-only data directory under a real ``rc serve`` and ``rc worker``.

The data directory (or the worker's state directory) is a tmpfs of a few MiB
(``support.diskfaults``), filled to ENOSPC or bound read-only while the process runs.
What must hold (API-002/003, SRV-011, LOG-001, EXT-OUTBOX-1): every write the
controller cannot make is a ``500`` with the spec's error body (``store_error``, or
``log_error`` for a log chunk), never a hang, a dropped connection or an
acknowledgement of something not stored; reads keep answering; no device is handed out
without its lease; writes work again once there is room; after a restart every
acknowledged change is there and ``PRAGMA integrity_check`` is ``ok``. A worker whose
state directory is full still delivers its terminal report (from memory), across a
controller outage too.
"""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import RC, Cluster, free_port, stop
from support import diskfaults

pytestmark = pytest.mark.e2e

WHY = diskfaults.available()
needs_mount = pytest.mark.skipif(bool(WHY), reason=WHY or "")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp=tmp_path, port=free_port())
    try:
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)


@pytest.fixture
def data_disk(tmp_path: Path) -> Iterator[diskfaults.SmallDisk]:
    disk = diskfaults.SmallDisk(tmp_path / "data", size=4 * diskfaults.MIB)
    try:
        yield disk
    finally:
        disk.close()


def register(c: Cluster, host: str = "h0", n: int = 2) -> str:
    status, body = c.api(
        "POST",
        "/v1/workers/register",
        {"host": host, "devices": [{"name": f"gpu{i}"} for i in range(n)]},
        token="wtok",
    )
    assert status == 200, body
    return str(body["worker_id"])


def submit(c: Cluster, device: str, tag: str) -> tuple[int, Any]:
    body = {"command": ["true"], "submitter": "alice", "device_id": device, "idempotency_key": tag}
    return c.api("POST", "/v1/jobs", body)


def assert_spec_error(status: int, body: Any, code: str) -> None:
    """API-002: exactly ``error`` and ``message``; API-003: no driver text leaked."""
    assert status == 500, (status, body)
    assert isinstance(body, dict) and set(body) == {"error", "message"}, body
    assert body["error"] == code, body
    assert "sqlite" not in body["message"].lower() and "errno" not in body["message"].lower()


def take(c: Cluster, wid: str) -> list[str]:
    status, body = c.api("GET", f"/v1/workers/{wid}/assignments?wait=100ms", token="wtok")
    if status == 204:  # nothing for it
        return []
    assert status == 200, body
    return [a["job_id"] for a in body["assignments"]]


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@needs_mount
@pytest.mark.timeout(60)
def test_rc_serve_refuses_to_start_on_a_read_only_data_directory(
    cluster: Cluster, data_disk: diskfaults.SmallDisk
) -> None:
    # SRV-011: the database cannot be opened for writing: exit 1, ``rc: <error>``,
    # before the socket is bound.
    data_disk.read_only()
    proc = subprocess.run(
        [
            RC,
            "serve",
            "--addr",
            f"127.0.0.1:{cluster.port}",
            "--data",
            str(data_disk.path),
        ],
        env=dict(cluster.env(), RC_TOKENS="wtok:worker,ctok:client,atok:admin"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("rc: "), proc.stderr[-2000:]
    assert str(data_disk.path) in proc.stderr and "unable to open database file" in proc.stderr
    assert "sqlalche.me" not in proc.stderr and "Traceback" not in proc.stderr
