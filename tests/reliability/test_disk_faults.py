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

import json
import sqlite3
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import RC, Cluster, free_port, stop, wait_for
from support import diskfaults

pytestmark = pytest.mark.e2e

WHY = diskfaults.available()
needs_mount = pytest.mark.skipif(bool(WHY), reason=WHY or "")


class PatientCluster(Cluster):
    """The e2e cluster, allowing a slow start-up (75 s more) on a loaded machine.

    ``Cluster`` gives a process 15 s to answer; with the machine's two cores shared by
    a loaded suite an ``rc serve`` took longer just to import. The bound is raised
    only while the process is alive, so a controller that died still fails at once.
    """

    def _patient(self, proc: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode}")
        wait_for(ready, 75, "the process to be up")

    def start_controller(self, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
        try:
            return super().start_controller(*args, **kw)
        except AssertionError:
            assert self.controller is not None
            self._patient(self.controller, lambda: self._answers("/v1/state"))
            return self.controller

    def start_worker(
        self,
        host: str,
        devices: list[str] | str,
        extra: str = "",
        env: dict[str, str] | None = None,
        heartbeat: str = "1s",
        wait: bool = True,
        token: str = "wtok",
        args: tuple[str, ...] = (),
        controller_url: str = "",
    ) -> subprocess.Popen[bytes]:
        proc = super().start_worker(
            host, devices, extra, env, heartbeat, False, token, args, controller_url
        )
        if wait:
            assert isinstance(devices, list), "these tests name their devices"
            want = {f"{host}:{d}" for d in devices}
            self._patient(proc, lambda: want <= self._device_ids())
        return proc

    def _answers(self, path: str) -> bool:
        try:
            return self.api("GET", path)[0] == 200
        except OSError:
            return False

    def _device_ids(self) -> set[str]:
        try:
            status, views = self.api("GET", "/v1/devices")
        except OSError:
            return set()
        return {v["device"]["id"] for v in views} if status == 200 else set()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = PatientCluster(tmp=tmp_path, port=free_port())
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
@pytest.mark.timeout(300)
def test_a_full_data_disk_refuses_writes_cleanly_keeps_reads_and_recovers(
    cluster: Cluster, data_disk: diskfaults.SmallDisk
) -> None:
    cluster.start_controller()
    wid = register(cluster)
    status, first = submit(cluster, "h0:gpu0", "before")
    assert status == 201 and first["state"] == "assigned", first
    assert take(cluster, wid) == [first["id"]]

    data_disk.fill()
    acked: dict[str, str] = {}  # idempotency key -> job ID, for every 201
    refused = 0
    # Each submit is a transaction; the WAL may still have room in pages it already
    # holds, so keep writing until the disk bites (or give up: then nothing failed).
    for i in range(400):
        status, body = submit(cluster, "h0:gpu1", f"full-{i}")
        if status == 201:
            acked[f"full-{i}"] = body["id"]
            continue
        assert_spec_error(status, body, "store_error")
        refused += 1
        if refused >= 5:
            break
    assert refused >= 5, "the full disk never refused a write"
    # Reads keep answering while nothing can be written.
    for path in ("/v1/devices", "/v1/jobs", f"/v1/jobs/{first['id']}", "/v1/state"):
        status, body = cluster.api("GET", path)
        assert status == 200, (path, status, body)
    # A log chunk cannot be stored: the log route's own code (LOG-001), never a 2xx.
    chunk = b"x" * 200_000
    req = urllib.request.Request(
        f"{cluster.url}/v1/jobs/{first['id']}/logs",
        data=chunk,
        method="POST",
        headers={"Authorization": "Bearer wtok", "Content-Type": "application/octet-stream"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            log_status, log_body = resp.status, None
    except urllib.error.HTTPError as exc:
        log_status, log_body = exc.code, json.loads(exc.read())
    assert log_status == 500 and log_body is not None, (log_status, log_body)
    assert_spec_error(log_status, log_body, "log_error")
    # No device went out without its lease: what the worker is handed is what holds one.
    handed = take(cluster, wid)
    status, views = cluster.api("GET", "/v1/devices")
    busy = {v["device"]["id"]: v.get("job_id") for v in views if v["device"]["state"] == "busy"}
    for job_id in handed:
        assert job_id in busy.values(), (job_id, busy)

    data_disk.free()
    status, after = submit(cluster, "h0:gpu1", "after")
    assert status == 201, after
    acked["after"] = after["id"]
    assert cluster.api("GET", "/v1/devices")[0] == 200

    # Restart on the same directory: every acknowledged job is there, nothing is torn.
    assert cluster.controller is not None
    stop(cluster.controller)
    db = data_disk.path / "rc.db"
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    stored = dict(rows(db, "SELECT idempotency_key, id FROM jobs"))
    missing = {k: v for k, v in acked.items() if stored.get(k) != v}
    assert missing == {}, missing
    live = rows(db, "SELECT device_id, COUNT(*) FROM leases WHERE released_at IS NULL GROUP BY 1")
    assert all(n == 1 for _, n in live), live
    cluster.start_controller()
    for job_id in (first["id"], *acked.values()):
        assert cluster.api("GET", f"/v1/jobs/{job_id}")[0] == 200


@needs_mount
@pytest.mark.timeout(150)
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
        timeout=120,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("rc: "), proc.stderr[-2000:]
    assert str(data_disk.path) in proc.stderr
    # Making the directory private is the first write; the database would be the next.
    assert "Read-only file system" in proc.stderr or "unable to open database" in proc.stderr
    assert "sqlalche.me" not in proc.stderr and "Traceback" not in proc.stderr


@needs_mount
@pytest.mark.timeout(300)
def test_a_data_directory_gone_read_only_under_a_running_controller(
    cluster: Cluster, data_disk: diskfaults.SmallDisk
) -> None:
    # The database and its WAL were opened before: their descriptors keep writing, so
    # submissions go on. A job's log file is created on its first chunk (LOG-001):
    # that create is refused, and the chunk answered 500 log_error, not acknowledged.
    cluster.start_controller()
    wid = register(cluster)
    status, job = submit(cluster, "h0:gpu0", "ro")
    assert status == 201 and take(cluster, wid) == [job["id"]]
    data_disk.read_only()

    def append() -> tuple[int, Any]:
        req = urllib.request.Request(
            f"{cluster.url}/v1/jobs/{job['id']}/logs",
            data=b"hello\n",
            method="POST",
            headers={"Authorization": "Bearer wtok"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, None
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = append()
    assert_spec_error(status, body, "log_error")
    assert cluster.api("GET", f"/v1/jobs/{job['id']}")[0] == 200
    data_disk.read_write()
    assert append()[0] == 200
    assert (data_disk.path / "logs" / f"{job['id']}.log").read_bytes() == b"hello\n"


@needs_mount
@pytest.mark.timeout(300)
def test_a_worker_with_a_full_state_directory_still_delivers_its_terminal_report(
    cluster: Cluster, tmp_path: Path
) -> None:
    # EXT-OUTBOX-1 writes the report to disk before its first attempt; a disk that
    # refuses must not cost the outcome: the report is kept in memory and retried,
    # here across a controller outage that outlasts the job.
    state = diskfaults.SmallDisk(tmp_path / "state-h0", size=1 * diskfaults.MIB)
    try:
        cluster.start_controller()
        cluster.start_worker("h0", ["gpu0"], heartbeat="1s")
        status, job = cluster.api(
            "POST",
            "/v1/jobs",
            {
                "command": ["sh", "-c", "sleep 4; exit 3"],
                "submitter": "alice",
                "device_id": "h0:gpu0",
            },
        )
        assert status == 201, job
        wait_for(lambda: cluster.job(job["id"])["state"] == "running", 20, "the job to run")
        state.fill()
        assert cluster.controller is not None
        stop(cluster.controller)  # down while the job ends and its report cannot be written
        wait_for(
            lambda: "kept in memory only" in (tmp_path / "worker-h0.log").read_text(),
            30,
            "the worker to say its report is kept in memory",
        )
        assert not list((state.path / "outbox").glob("*.json"))  # nothing reached the disk
        cluster.start_controller()

        def terminal() -> dict[str, Any] | None:
            j = cluster.job(job["id"])
            return j if j["state"] in ("succeeded", "failed", "lost", "killed") else None

        done = wait_for(terminal, 60, "the report to land")
        assert (done["state"], done.get("exit_code")) == ("failed", 3), done
        status, views = cluster.api("GET", "/v1/devices")
        assert [v["device"]["state"] for v in views] == ["ready"], views
    finally:
        for proc in reversed(cluster.procs):
            stop(proc)
        state.close()
