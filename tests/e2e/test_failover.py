"""Several controllers on one PostgreSQL database (EXT-PG-2, -3, -5, -8, -9).

Two ``rc serve`` processes share a database; workers list both URLs. One leads (its
``/healthz`` says so); the leader is killed with SIGKILL while jobs run and queue, and
the other must lead within 5 s, with every job ending ``succeeded``, none run twice and
no two jobs ever on one device at once. With three, the leader is frozen (SIGSTOP)
instead: another leads within 5 s all the same, and the old one, resumed, neither leads
nor writes anything as leader (the server's statement log says what it ran).
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
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


def _controllers(tmp_path: Path, database: str, n: int = 2) -> list[Cluster]:
    controllers = []
    for name in "abc"[:n]:
        c = Cluster(tmp=tmp_path / name, port=free_port())
        c.tmp.mkdir()
        controllers.append(c)
        c.start_controller("--database", database)
    return controllers


def _stop_all(controllers: list[Cluster]) -> None:
    for c in controllers:
        for proc in reversed(c.procs):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)  # a frozen one must be able to stop
            stop(proc)


@pytest.fixture
def fleet(tmp_path: Path, pg_cluster: pg.Cluster) -> Iterator[tuple[Cluster, Cluster]]:
    a, b = _controllers(tmp_path, pg_cluster.fresh_database())
    try:
        yield a, b
    finally:
        _stop_all([a, b])


@pytest.fixture
def trio(tmp_path: Path, pg_cluster: pg.Cluster) -> Iterator[tuple[list[Cluster], str]]:
    """Three controllers on a database whose every statement the server logs."""
    url = pg_cluster.fresh_database()
    pg_cluster.psql(f"ALTER DATABASE {urlsplit(url).path.lstrip('/')} SET log_statement = 'all'")
    controllers = _controllers(tmp_path, url, 3)
    try:
        yield controllers, url
    finally:
        _stop_all(controllers)


def _jobs_on(controllers: list[Cluster], runs: Path) -> list[str]:
    """``JOBS`` jobs, each noting its start and end in ``runs``, submitted round the
    controllers."""
    script = (
        'echo "start $RC_JOB_ID $RC_DEVICE $(date +%s.%N)" >> ' + str(runs) + "; sleep 1.5; "
        'echo "end $RC_JOB_ID $RC_DEVICE $(date +%s.%N)" >> ' + str(runs)
    )
    ids = []
    for n in range(JOBS):
        target = controllers[n % len(controllers)]
        status, job = target.api(
            "POST", "/v1/jobs", {"command": ["sh", "-c", script], "submitter": "s"}
        )
        assert status == 201, job
        ids.append(job["id"])
    return ids


def _assert_each_ran_once_alone(c: Cluster, ids: list[str], runs: Path) -> None:
    """EXT-PG-9: every job succeeded, none ran twice, no two on one device at once."""
    for job_id in ids:
        c.wait_job(job_id, lambda j: j["state"] in ("succeeded", "failed", "lost"), 60)
    states = {c.job(j)["state"] for j in ids}
    assert states == {"succeeded"}, (states, c.logs())
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
    ids = _jobs_on([b, a], runs)
    wait_for(lambda: runs.exists() and "start" in runs.read_text(), 20, "jobs to start")

    stop(leader.controller, signal.SIGKILL)  # type: ignore[arg-type]
    killed = time.monotonic()
    wait_for(lambda: _leader(other), 15, "the other controller to lead", every=0.05)
    takeover = time.monotonic() - killed
    print(f"takeover {takeover:.2f} s")
    assert takeover <= TAKEOVER_BOUND, takeover
    _assert_each_ran_once_alone(other, ids, runs)


def _lease(url: str) -> tuple[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT holder, epoch FROM leadership").fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


#: What a controller runs only as leader: the fence every leader-only write begins with
#: (``store/leadership.py``), the sweep's first read and log retention's.
AS_LEADER = ("FOR KEY SHARE", "workers.last_heartbeat_at", "logs_pruned = 0")


def test_a_frozen_leader_is_replaced_and_once_resumed_neither_leads_nor_writes_as_leader(
    trio: tuple[list[Cluster], str], pg_cluster: pg.Cluster, tmp_path: Path
) -> None:
    """EXT-PG-8: SIGSTOP keeps the leader's sessions (and the kernel its connections)
    alive; another leads within 5 s all the same, a job submitted meanwhile runs, and the
    old one, resumed, does not lead and runs nothing a leader runs."""
    controllers, url = trio
    wait_for(lambda: [_leader(c) for c in controllers].count(True) == 1, 15, "one leader")
    frozen = next(c for c in controllers if _leader(c))
    live = [c for c in controllers if c is not frozen]
    assert frozen.controller is not None
    # The workers and clients use the live controllers: a frozen one answers nobody.
    for host in ("h1", "h2"):
        live[0].start_worker(host, ["gpu0", "gpu1"], controller_url=f"{live[0].url},{live[1].url}")
    runs = tmp_path / "runs"
    ids = _jobs_on(live, runs)
    wait_for(lambda: runs.exists() and "start" in runs.read_text(), 20, "jobs to start")

    frozen.controller.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        new = wait_for(
            lambda: next((c for c in live if _leader(c)), None), 15, "another to lead", every=0.05
        )
        takeover = time.monotonic() - stopped
        print(f"takeover after SIGSTOP {takeover:.2f} s")
        assert takeover <= TAKEOVER_BOUND, takeover
        status, job = live[1].api("POST", "/v1/jobs", {"command": ["true"], "submitter": "s"})
        assert status == 201, job
        live[1].wait_job(job["id"], lambda j: j["state"] == "succeeded", timeout=20)
        _assert_each_ran_once_alone(new, ids, runs)
        lease = _lease(url)
        resumed_at = pg_cluster.log.stat().st_size
    finally:
        frozen.controller.send_signal(signal.SIGCONT)

    # Resumed: it does not lead, nor take the lease back, for several leases' time.
    deadline = time.monotonic() + 2 * 3.0
    while time.monotonic() < deadline:
        assert _leader(frozen) is not True
        assert _leader(new) is True
        time.sleep(0.1)
    assert _lease(url) == lease
    with pg_cluster.log.open("rb") as log:
        log.seek(resumed_at)
        ran = log.read().decode(errors="replace").splitlines()
    mine = [line for line in ran if f"] rc {frozen.controller.pid}: " in line]
    assert mine, "no statement of the resumed controller in the server's log"
    as_leader = [line for line in mine if any(mark in line for mark in AS_LEADER)]
    assert as_leader == [], as_leader


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
