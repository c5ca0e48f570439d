"""Silence is never proof: crashes, reboots, restarts and outages with real processes.

Timings are shortened through the test-only ``RC_TEST_TIMINGS`` hook of ``rc serve``
and ``rc worker``; the shipped defaults are the spec's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.nemesis import FaultProxy

from .cluster import (
    Cluster,
    Json,
    children,
    kill_job_processes,
    pids_with_job,
    stop,
    wait_for,
)

FAST_CONTROLLER = {"RC_TEST_TIMINGS": "sweep_interval=0.5,grace=2,unhealthy_after=6,hold_off=2"}
FAST_WORKER = {"RC_TEST_TIMINGS": "reregister_after=4,reregister_jitter=0.2,reregister_retry=1"}


def device(cluster: Cluster, device_id: str) -> dict[str, Json]:
    _, views = cluster.api("GET", "/v1/devices")
    view: dict[str, Json]
    for view in views:
        if view["device"]["id"] == device_id:
            return view
    raise AssertionError(f"no device {device_id}")


def submit(cluster: Cluster, device_id: str, *command: str) -> str:
    status, job = cluster.api(
        "POST", "/v1/jobs", {"device_id": device_id, "command": list(command), "submitter": "t"}
    )
    assert status == 201, job
    return str(job["id"])


def running(cluster: Cluster, job_id: str) -> None:
    cluster.wait_job(job_id, lambda j: j["state"] == "running")


def test_worker_killed_mid_job_leaves_the_device_out_until_an_admin_clears_it(
    cluster: Cluster,
) -> None:
    cluster.start_controller(env=FAST_CONTROLLER)
    worker = cluster.start_worker("box", ["gpu0"], env=FAST_WORKER)
    job = submit(cluster, "box:gpu0", "sleep", "300")
    running(cluster, job)
    try:
        # `running` is set at hand-out; wait for the process itself before the crash.
        wait_for(lambda: pids_with_job(job), 10, "the job's process")
        stop(worker, signal.SIGKILL)
        assert pids_with_job(job), "the orphaned job should still be running"
        cluster.start_worker("box", ["gpu0"], env=FAST_WORKER)
        final = cluster.wait_job(job, lambda j: j["state"] == "lost")
        assert final["kill_reason"] == "worker re-registered"
        # A survivor with the job's RC_JOB_ID is still there: no proof, no recovery.
        view = device(cluster, "box:gpu0")
        assert view["device"]["state"] == "unhealthy"
        assert view["quarantine_reason"] == "registration"
        r = cluster.rc("clear", "box:gpu0", token="ctok")
        assert r.returncode == 1 and "forbidden" in r.stderr, r.stderr
        kill_job_processes(job)
        r = cluster.rc("clear", "box:gpu0", token="atok")
        assert r.returncode == 0 and r.stdout.strip() == "cleared box:gpu0", r.stderr
        assert device(cluster, "box:gpu0")["device"]["state"] == "ready"
    finally:
        kill_job_processes(job)


def test_a_reboot_proves_the_device_free(cluster: Cluster, tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-one\n")
    env = {**FAST_WORKER, "RC_TEST_BOOT_ID_PATH": str(boot)}
    cluster.start_controller(env=FAST_CONTROLLER)
    worker = cluster.start_worker("box", ["gpu0"], env=env)
    job = submit(cluster, "box:gpu0", "sleep", "300")
    running(cluster, job)
    try:
        wait_for(lambda: pids_with_job(job), 10, "the job's process")
        stop(worker, signal.SIGKILL)
        kill_job_processes(job)  # the "reboot" took the job with it
        boot.write_text("boot-two\n")
        cluster.start_worker("box", ["gpu0"], env=env)
        final = cluster.wait_job(job, lambda j: j["state"] == "lost")
        assert final["kill_reason"] == "host rebooted"
        assert device(cluster, "box:gpu0")["device"]["state"] == "ready"
    finally:
        kill_job_processes(job)


def test_controller_restart_does_not_cost_a_running_job(cluster: Cluster) -> None:
    controller = cluster.start_controller(env=FAST_CONTROLLER)
    cluster.start_worker("box", ["gpu0"], env=FAST_WORKER, heartbeat="500ms")
    job = submit(cluster, "box:gpu0", "sh", "-c", "sleep 4; exit 7")
    running(cluster, job)
    stop(controller, signal.SIGKILL)
    time.sleep(1)
    cluster.start_controller(env=FAST_CONTROLLER)
    final = cluster.wait_job(job, lambda j: j["state"] not in ("assigned", "running"), timeout=30)
    assert final["state"] == "failed" and final["exit_code"] == 7, final
    view = device(cluster, "box:gpu0")
    assert view["device"]["state"] == "ready", view
    _, listing = cluster.api("GET", "/v1/jobs?state=lost")
    assert listing["jobs"] == []


def test_a_stopped_worker_goes_unknown_and_comes_back(cluster: Cluster) -> None:
    cluster.start_controller(env=FAST_CONTROLLER)
    worker = cluster.start_worker("box", ["gpu0"], env=FAST_WORKER, heartbeat="500ms")
    worker.send_signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: device(cluster, "box:gpu0")["device"]["state"] == "unknown",
            10,
            "the device to go unknown",
        )
    finally:
        worker.send_signal(signal.SIGCONT)
    wait_for(
        lambda: device(cluster, "box:gpu0")["device"]["state"] == "ready",
        10,
        "the device to come back",
    )


def test_a_setsid_escapee_is_swept_after_the_job(cluster: Cluster) -> None:
    cluster.start_controller(env=FAST_CONTROLLER)
    cluster.start_worker("box", ["gpu0"], env=FAST_WORKER)
    job = submit(
        cluster,
        "box:gpu0",
        "sh",
        "-c",
        # the leader lingers so the child has left the group (setsid) before it exits
        "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & sleep 0.5; echo started",
    )
    try:
        final = cluster.wait_job(job, lambda j: j["state"] not in ("queued", "assigned", "running"))
        assert final["state"] == "succeeded", final
        wait_for(lambda: not pids_with_job(job), 10, "no process with the job's RC_JOB_ID")
    finally:
        kill_job_processes(job)


def test_outcomes_survive_a_controller_outage(cluster: Cluster) -> None:
    """Jobs finish while the controller is down longer than the base report budget:
    every outcome lands once it is back, and no device is quarantined (EXT-OUTBOX)."""
    controller = cluster.start_controller(env=FAST_CONTROLLER)
    cluster.start_worker("box", ["gpu0", "gpu1"], env=FAST_WORKER, heartbeat="500ms")
    jobs = [submit(cluster, f"box:gpu{i}", "sh", "-c", f"sleep 1; exit {i + 3}") for i in range(2)]
    for job in jobs:
        running(cluster, job)
    stop(controller, signal.SIGKILL)
    # The jobs end meanwhile. The outage is longer than the base report budget (5
    # attempts, ~28 s, WRK-112): without the outbox both outcomes would be lost.
    time.sleep(30)
    cluster.start_controller(env=FAST_CONTROLLER)
    for i, job in enumerate(jobs):
        final = cluster.wait_job(
            job, lambda j: j["state"] not in ("assigned", "running"), timeout=30
        )
        assert final["state"] == "failed" and final["exit_code"] == i + 3, final
    time.sleep(3)  # a few sweeps after the hold-off
    for i in range(2):
        assert device(cluster, f"box:gpu{i}")["device"]["state"] == "ready"


@contextlib.contextmanager
def pid_namespace() -> Iterator[tuple[str, ...]]:
    """A PID namespace with a ``/proc`` of its own, and the wrapper that starts a process
    inside it; everything in it dies with it.

    On this test machine PID 1's environment cannot be read, which makes every survivor
    scan blind (no proof, WRK-141); in the namespace every process can be read.
    """
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        pytest.skip("needs root, unshare and nsenter")
    init = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "infinity"]
    )
    try:
        (inner,) = wait_for(lambda: children(init.pid), 10, "the namespace's init")
        yield ("nsenter", "--target", str(inner), "--pid", "--mount", "--")
    finally:
        stop(init, signal.SIGKILL)


def test_another_workers_job_on_the_host_is_no_survivor(cluster: Cluster) -> None:
    """Two workers on one host, each with its own state_dir: one is SIGKILLed mid-job and
    its job dies with it, the other's job runs on. The restarted worker's proof returns
    its device (the other's job is not its survivor), its own sweeps leave the other's
    job alone, and a real survivor of its own job still keeps its device out (WRK-141,
    WRK-120)."""
    cluster.start_controller(env=FAST_CONTROLLER)
    with pid_namespace() as inside:
        cluster.worker_wrap = inside
        _two_workers_on_one_host(cluster)


def _two_workers_on_one_host(cluster: Cluster) -> None:
    def start_one() -> int:
        wrapper = cluster.start_worker("one", ["gpu0"], env=FAST_WORKER)
        pids: list[int] = wait_for(lambda: children(wrapper.pid), 10, "worker one's process")
        return pids[0]

    worker = start_one()
    cluster.start_worker("two", ["gpu0"], env=FAST_WORKER)
    theirs = submit(cluster, "two:gpu0", "sleep", "300")
    mine = submit(cluster, "one:gpu0", "sleep", "300")
    again = ""
    try:
        for job in (theirs, mine):
            running(cluster, job)
        wait_for(lambda: pids_with_job(theirs) and pids_with_job(mine), 10, "the jobs' processes")
        os.kill(worker, signal.SIGKILL)
        kill_job_processes(mine)  # the job truly died with its worker
        wait_for(lambda: not pids_with_job(mine), 10, "the killed job's processes to go")
        worker = start_one()
        final = cluster.wait_job(mine, lambda j: j["state"] == "lost")
        assert final["kill_reason"] == "worker re-registered"
        wait_for(
            lambda: device(cluster, "one:gpu0")["device"]["state"] == "ready",
            10,
            "the proof to return one:gpu0 to the pool",
        )
        quick = submit(cluster, "one:gpu0", "true")
        assert cluster.wait_job(quick, lambda j: j["state"] == "succeeded")["exit_code"] == 0
        assert pids_with_job(theirs), "the other worker's job must run on"
        assert cluster.job(theirs)["state"] == "running"

        again = submit(cluster, "one:gpu0", "sleep", "300")
        running(cluster, again)
        wait_for(lambda: pids_with_job(again), 10, "the second job's process")
        os.kill(worker, signal.SIGKILL)
        start_one()
        cluster.wait_job(again, lambda j: j["state"] == "lost")
        view = device(cluster, "one:gpu0")
        assert view["device"]["state"] == "unhealthy", view  # its own survivor: no proof
        assert view["quarantine_reason"] == "registration"
        assert device(cluster, "two:gpu0")["device"]["state"] == "busy"
    finally:
        for job in (theirs, mine, again):
            if job:
                kill_job_processes(job)


def test_output_the_controller_cannot_store_for_a_while_arrives_once_before_the_outcome(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The controller's log store fails for real (a directory where the job's log file
    is: every append answers 500 log_error) while the job prints and ends. The worker
    keeps that output in its outbox and holds the outcome back behind it; once the store
    works again every byte is stored once, in order, and only then does the job end
    (WRK-072, WRK-085, EXT-OUTBOX-1)."""
    cluster.start_controller(env=FAST_CONTROLLER)
    cluster.start_worker("box", ["gpu0"], env={"RC_TEST_TIMINGS": "outbox_backoff_max=0.5"})
    go, ended = tmp_path / "go", tmp_path / "ended"
    lines = [f"line {i}" for i in range(60)]
    script = (
        f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; "
        f"for l in {' '.join(f'{n}' for n in range(60))}; do echo line $l; sleep 0.02; done; "
        f"touch {ended}"
    )
    job = submit(cluster, "box:gpu0", "sh", "-c", script)
    stored = cluster.tmp / "data" / "logs" / f"{job}.log"
    wait_for(lambda: stored.exists() and stored.read_bytes() == b"first\n", 20, "the first line")
    aside = stored.with_name("aside")
    os.replace(stored, aside)
    stored.mkdir()  # from here every append of this job fails in the store
    go.touch()
    wait_for(ended.exists, 20, "the job to print everything and end")
    time.sleep(2)  # its output is retried meanwhile, and refused
    assert cluster.job(job)["state"] == "running"  # the outcome waits behind the output
    stored.rmdir()
    os.replace(aside, stored)
    final = cluster.wait_job(job, lambda j: j["state"] not in ("assigned", "running"), 30)
    assert final["state"] == "succeeded", final
    assert stored.read_text() == "first\n" + "".join(f"{line}\n" for line in lines)
    r = cluster.rc("logs", job)
    assert r.returncode == 0 and r.stdout == stored.read_text(), r.stderr


def test_a_hand_out_whose_answer_is_lost_is_handed_out_again(cluster: Cluster) -> None:
    # The controller commits a hand-out (the job is `running`) and its answer never
    # reaches the worker, as when the controller dies between the two. The worker's next
    # poll names the jobs it has, so the controller hands the job out again and it runs
    # once, instead of waiting out its lease to end `lost`.
    cluster.start_controller()
    with FaultProxy(cluster.port) as proxy:
        cluster.start_worker("lossy", ["gpu0"], controller_url=proxy.url)

        def lose_first_hand_out(direction: str, chunk: bytes) -> bool:
            return direction == "down" and proxy.lost == 0 and b'"job_id"' in chunk

        proxy.lose = lose_first_hand_out
        job_id = submit(cluster, "lossy:gpu0", "sh", "-c", "echo handed-again")
        done = cluster.wait_job(
            job_id, lambda j: j["state"] not in ("queued", "assigned", "running"), timeout=30
        )
        assert proxy.lost == 1
        assert done["state"] == "succeeded", done
        out = cluster.rc("logs", job_id)
        assert out.stdout == "handed-again\n", out
