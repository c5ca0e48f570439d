"""Several controllers on one PostgreSQL database (EXT-PG-2, -3, -5, -8, -9).

Two ``rc serve`` processes share a database; workers list both URLs. One leads (its
``/healthz`` says so); the leader is killed with SIGKILL while jobs run and queue, and
the other must lead within 5 s, with every job ending ``succeeded``, none run twice and
no two jobs ever on one device at once.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import pg

from .cluster import Cluster, free_port, stop, wait_for

JOBS = 12
TAKEOVER_BOUND = 5.0


def _leader(c: Cluster) -> bool | None:
    """The controller's ``leader`` flag; None when it does not answer."""
    try:
        status, body = c.api("GET", "/healthz")
    except OSError:
        return None
    return bool(body["leader"]) if status == 200 else None


def _controllers(tmp_path: Path, database: str) -> tuple[Cluster, Cluster]:
    a = Cluster(tmp=tmp_path / "a", port=free_port())
    b = Cluster(tmp=tmp_path / "b", port=free_port())
    for c in (a, b):
        c.tmp.mkdir()
        c.start_controller("--database", database)
    return a, b


@pytest.fixture
def fleet(tmp_path: Path, pg_cluster: pg.Cluster) -> Iterator[tuple[Cluster, Cluster]]:
    a, b = _controllers(tmp_path, pg_cluster.fresh_database())
    try:
        yield a, b
    finally:
        for c in (a, b):
            for proc in reversed(c.procs):
                stop(proc)


def test_one_of_two_controllers_leads_and_a_job_submitted_to_either_runs(
    fleet: tuple[Cluster, Cluster],
) -> None:
    a, b = fleet
    wait_for(lambda: {_leader(a), _leader(b)} == {True, False}, 15, "exactly one leader")
    # The worker dials only A; a job submitted to B is placed and handed out at once.
    a.start_worker("box", ["gpu0"])
    command = ["echo", "hello from the worker of A"]
    status, job = b.api("POST", "/v1/jobs", {"command": command, "submitter": "s"})
    assert status == 201, job
    done = b.wait_job(job["id"], lambda j: j["state"] == "succeeded", timeout=20)
    assert done["exit_code"] == 0
    # The output reached A; B reads it from the database (EXT-PG-4).
    logs = b.rc("logs", job["id"], RC_CONTROLLER=b.url)
    assert logs.stdout == "hello from the worker of A\n", logs


def test_killing_the_leader_loses_no_job_and_doubles_none(
    fleet: tuple[Cluster, Cluster], tmp_path: Path
) -> None:
    a, b = fleet
    wait_for(lambda: {_leader(a), _leader(b)} == {True, False}, 15, "exactly one leader")
    leader, other = (a, b) if _leader(a) else (b, a)
    both = f"{a.url},{b.url}"
    for host in ("h1", "h2"):
        other.start_worker(host, ["gpu0", "gpu1"], controller_url=both)
    runs = tmp_path / "runs"
    script = (
        'echo "start $RC_JOB_ID $RC_DEVICE $(date +%s.%N)" >> ' + str(runs) + "; sleep 1.5; "
        'echo "end $RC_JOB_ID $RC_DEVICE $(date +%s.%N)" >> ' + str(runs)
    )
    ids = []
    for n in range(JOBS):
        target = a if n % 2 else b
        status, job = target.api(
            "POST", "/v1/jobs", {"command": ["sh", "-c", script], "submitter": "s"}
        )
        assert status == 201, job
        ids.append(job["id"])
    wait_for(lambda: runs.exists() and "start" in runs.read_text(), 20, "jobs to start")

    stop(leader.controller, signal.SIGKILL)  # type: ignore[arg-type]
    killed = time.monotonic()
    wait_for(lambda: _leader(other), 15, "the other controller to lead", every=0.05)
    takeover = time.monotonic() - killed
    print(f"takeover {takeover:.2f} s")
    assert takeover <= TAKEOVER_BOUND, takeover

    for job_id in ids:
        other.wait_job(job_id, lambda j: j["state"] in ("succeeded", "failed", "lost"), 60)
    states = {other.job(j)["state"] for j in ids}
    assert states == {"succeeded"}, (states, other.logs())

    starts: dict[str, list[tuple[str, float]]] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    begun: dict[str, float] = {}
    for line in runs.read_text().splitlines():
        kind, job_id, device, at = line.split()
        if kind == "start":
            starts.setdefault(job_id, []).append((device, float(at)))
            begun[job_id] = float(at)
        else:
            spans.setdefault(device, []).append((begun[job_id], float(at)))
    assert sorted(starts) == sorted(ids)
    assert all(len(s) == 1 for s in starts.values()), starts  # none ran twice
    for device, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert end <= start, (device, intervals)  # never two jobs on one device


def test_a_frozen_controller_is_left_for_the_next(fleet: tuple[Cluster, Cluster]) -> None:
    """EXT-PG-5: a SIGSTOPped controller keeps its connections open and answers nothing.
    The worker long-polling it leaves it once the poll's bound (its wait plus a margin)
    is out, and takes the job the other controller placed meanwhile; its reports go
    there too."""
    a, b = fleet
    a.start_worker("box", ["gpu0"], extra="poll_wait: 3s\n", controller_url=f"{a.url},{b.url}")
    frozen = a.controller
    assert frozen is not None
    frozen.send_signal(signal.SIGSTOP)
    try:
        status, job = b.api("POST", "/v1/jobs", {"command": ["true"], "submitter": "s"})
        assert status == 201, job
        done = b.wait_job(job["id"], lambda j: j["state"] == "succeeded", timeout=30)
        assert done["exit_code"] == 0
    finally:
        frozen.send_signal(signal.SIGCONT)
