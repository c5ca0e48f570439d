"""The faults ``rc run`` must live through, with real controllers on PostgreSQL
(EXT-PG-5, EXT-CLI-5, CLI-078, CLI-193): a controller frozen with SIGSTOP (its
connections stay open, nothing answers), and PostgreSQL itself stopped under a running
and a submitting ``rc run``. Each ends with the job's real exit code, its output whole
and once, and no error shown for a move to another controller.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import pg

from .cluster import Cluster, free_port, stop, wait_for

#: How long a controller stays frozen; ``rc run`` must be done well before.
FREEZE = 40.0


def _start(tmp: Path, database: str) -> Cluster:
    c = Cluster(tmp=tmp, port=free_port())
    c.tmp.mkdir()
    c.start_controller("--database", database)
    return c


@pytest.fixture
def pair(tmp_path: Path, pg_cluster: pg.Cluster) -> Iterator[tuple[Cluster, Cluster]]:
    database = pg_cluster.fresh_database()
    a, b = _start(tmp_path / "a", database), _start(tmp_path / "b", database)
    try:
        yield a, b
    finally:
        for c in (a, b):
            if c.controller is not None:
                c.controller.send_signal(signal.SIGCONT)
            for proc in reversed(c.procs):
                stop(proc)


def _running(c: Cluster) -> str:
    """The ID of the one job the tests' submitter has running."""
    status, found = c.api("GET", "/v1/jobs?submitter=tester&state=running")
    jobs = found["jobs"] if status == 200 else []
    return str(jobs[0]["id"]) if jobs else ""


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"rc run still running after {timeout}s: {err}") from None
    return proc.returncode, out, err


def test_a_frozen_controller_under_a_running_rc_run_is_left_for_the_other(
    pair: tuple[Cluster, Cluster],
) -> None:
    a, b = pair
    both = f"{a.url},{b.url}"
    b.start_worker("box", ["gpu0"], extra="poll_wait: 3s\n", controller_url=f"{b.url},{a.url}")
    script = "echo start; sleep 4; echo end; exit 3"
    proc = a.popen_rc("run", "--", "sh", "-c", script, RC_CONTROLLER=both)
    wait_for(lambda: _running(b), 20, "the job to start")
    assert a.controller is not None
    a.controller.send_signal(signal.SIGSTOP)  # rc run's follow and polls were on a
    frozen = time.monotonic()
    code, out, err = _finish(proc, FREEZE - 5)
    took = time.monotonic() - frozen
    print(f"rc run ended {took:.1f} s into the freeze")
    assert code == 3, err  # the job's own code
    assert out == "start\nend\n"  # nothing lost, nothing repeated (EXT-CLI-5)
    assert took < FREEZE / 2, took
    lines = err.splitlines()
    assert lines[0].startswith("rc: job ") and len(lines) <= 2, err  # one note at most
    assert "error" not in err and "lost" not in err, err


def test_a_submit_to_a_frozen_controller_goes_to_the_other(
    pair: tuple[Cluster, Cluster],
) -> None:
    a, b = pair
    b.start_worker("box", ["gpu0"], controller_url=b.url)
    assert a.controller is not None
    a.controller.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    proc = a.popen_rc("run", "--", "sh", "-c", "echo hi; exit 5", RC_CONTROLLER=f"{a.url},{b.url}")
    code, out, err = _finish(proc, FREEZE - 5)
    assert (code, out) == (5, "hi\n"), err
    assert time.monotonic() - frozen < FREEZE / 2
    a.controller.send_signal(signal.SIGCONT)
    # Thawed, a answers the submit it held with the job b made: one job, not two.
    time.sleep(1)
    status, found = b.api("GET", "/v1/jobs?submitter=tester")
    assert status == 200 and len(found["jobs"]) == 1, found


@pytest.fixture
def own_database(tmp_path: Path) -> Iterator[pg.Cluster]:
    """A PostgreSQL cluster of this test's own: it is stopped and started under it."""
    try:
        cluster = pg.start()
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot start a PostgreSQL cluster here ({exc})")
    try:
        from resource_controller.clock import FakeClock
        from resource_controller.store.facade import Store

        Store(cluster.url(pg.TEMPLATE), FakeClock()).close()
        yield cluster
    finally:
        cluster.stop()


def test_postgresql_stopped_under_a_running_and_a_submitting_rc_run(
    tmp_path: Path, own_database: pg.Cluster
) -> None:
    c = _start(tmp_path / "c", own_database.fresh_database())
    try:
        c.start_worker("box", ["gpu0", "gpu1"])
        running = c.popen_rc("run", "-d", "box:gpu0", "--", "sh", "-c", "echo a; sleep 3; exit 9")
        wait_for(lambda: _running(c), 20, "the first job to start")
        own_database.down()
        try:
            time.sleep(1)
            submitting = c.popen_rc("run", "-d", "box:gpu1", "--", "sh", "-c", "echo b; exit 4")
            time.sleep(9)
        finally:
            own_database.up()
        first = _finish(running, 120)
        second = _finish(submitting, 120)
    finally:
        for proc in reversed(c.procs):
            stop(proc)
    assert first[:2] == (9, "a\n"), (first, c.logs())  # the job's real code, 9
    assert second[:2] == (4, "b\n"), (second, c.logs())
    said = [line for line in second[2].splitlines() if "trying again" in line]
    assert len(said) == 1, second[2]  # said once
