"""Retries through real processes (EXT-RETRY-1, EXT-RETRY-2): ``rc run`` waits through a failed
attempt, ``rc logs`` shows both attempts, and a job whose worker dies runs again elsewhere."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from .cluster import Cluster, kill_job_processes, pids_with_job, stop, wait_for

FAST_CONTROLLER = {"RC_TEST_TIMINGS": "sweep_interval=0.5,grace=2,unhealthy_after=6,hold_off=2"}


def _job_id(stderr: str) -> str:
    found = re.search(r"job ([0-9a-f-]{36})", stderr)
    assert found, stderr
    return found.group(1)


def test_rc_run_waits_through_a_failed_attempt_and_rc_logs_shows_both(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    tries = tmp_path / "tries"
    script = (
        f'n=$(cat {tries} 2>/dev/null || echo 0); echo $((n + 1)) > {tries}; echo "try $n";'
        ' [ "$n" -ge 1 ] || exit 3'
    )
    r = cluster.rc("run", "--retries", "2", "--retry-on", "failed", "--", "sh", "-c", script)
    assert r.returncode == 0, (r.stdout, r.stderr)
    marker = "--- rc: attempt 1 failed, exit 3; attempt 2 queued ---"
    assert r.stdout.splitlines() == ["try 0", marker, "try 1"], r.stdout
    job_id = _job_id(r.stderr)
    logs = cluster.rc("logs", job_id)
    assert logs.stdout.splitlines() == ["try 0", marker, "try 1"], logs.stdout
    job = cluster.job(job_id)
    assert job["attempt"] == 2 and job["state"] == "succeeded" and job["retries"] == 2
    first, second = job["attempts"]
    assert (first["attempt"], first["state"], first["exit_code"]) == (1, "failed", 3)
    assert (second["attempt"], second["state"], second["exit_code"]) == (2, "succeeded", 0)
    assert first["device_id"] == second["device_id"] == "box:gpu0"


def test_bad_retry_flags_are_refused_naming_the_flag(cluster: Cluster) -> None:
    cluster.start_controller()
    for args, words in (
        (["--retries", "11"], "--retries 11 is outside 0..10"),
        (["--retries", "1", "--retry-on", "sometimes"], "--retry-on 'sometimes'"),
        (["--retry-on", "failed"], "--retry-on needs --retries"),
    ):
        r = cluster.rc("run", *args, "--", "true")
        assert r.returncode == 1 and words in r.stderr, (args, r.stderr)
    status, body = cluster.api(
        "POST", "/v1/jobs", {"command": ["true"], "submitter": "t", "retries": 11}
    )
    assert status == 400 and "retries" in str(body), body


def test_a_job_whose_worker_dies_runs_again_on_another_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_controller(env=FAST_CONTROLLER)
    first = cluster.start_worker("a", ["gpu0"])
    second = cluster.start_worker("b", ["gpu0"])
    flag = tmp_path / "started-once"
    script = f"if [ -e {flag} ]; then echo second; else touch {flag}; exec sleep 300; fi"
    status, job = cluster.api(
        "POST",
        "/v1/jobs",
        {"command": ["sh", "-c", script], "submitter": "t", "retries": 1, "device_id": ""},
    )
    assert status == 201, job
    job_id = str(job["id"])
    running = cluster.wait_job(job_id, lambda j: j["state"] == "running")
    wait_for(lambda: pids_with_job(job_id), 10, "the first attempt's process")
    lost_host = str(running["device_id"]).split(":")[0]
    stop(first if lost_host == "a" else second, signal.SIGKILL)
    kill_job_processes(job_id)  # the orphan of the dead worker
    killed_at = time.monotonic()
    done = cluster.wait_job(job_id, lambda j: j["state"] == "succeeded", timeout=30)
    took = time.monotonic() - killed_at
    assert done["attempt"] == 2 and not str(done["device_id"]).startswith(lost_host + ":")
    past, current = done["attempts"]
    assert past["state"] == "lost" and past["kill_reason"] == "worker lost"
    assert current["state"] == "succeeded"
    # Written off after 6 s of silence, swept every 0.5 s: running again within ~2 s of that.
    assert took < 6 + 2 + 5, took
    out = cluster.rc("logs", job_id).stdout
    assert out.splitlines() == [
        "--- rc: attempt 1 lost (worker lost); attempt 2 queued ---",
        "second",
    ]
