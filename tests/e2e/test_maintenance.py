"""Maintenance and fairness end to end, on real rc serve / rc worker / rc processes:
drain (EXT-DRAIN), nested runs (EXT-NEST-1), priority aging (EXT-FAIR-1) and the log
cap (EXT-KEEP-1)."""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from pathlib import Path

from .cluster import RC, Cluster, stop, wait_for

DEV = "box:gpu0"


def wait_file_job(flag: Path) -> list[str]:
    """A job that runs until ``flag`` exists."""
    return ["sh", "-c", f'while [ ! -e "{flag}" ]; do sleep 0.1; done']


def running_on(cluster: Cluster, device: str) -> str | None:
    for view in cluster.api("GET", "/v1/devices")[1]:
        if view["device"]["id"] == device and view.get("job_id"):
            return str(view["job_id"])
    return None


def test_drain_wait_returns_when_the_running_job_ends_and_nothing_new_starts(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    flag = tmp_path / "finish"
    first = cluster.popen_rc("run", "-d", DEV, "--", *wait_file_job(flag))
    first_id = wait_for(lambda: running_on(cluster, DEV), 15, "the first job to run")
    waiter = cluster.popen_rc("drain", DEV, "--reason", "driver upgrade", "--wait", token="atok")
    wait_for(
        lambda: cluster.api("GET", "/v1/devices")[1][0]["device"].get("draining"),
        10,
        "the drain to be recorded",
    )
    status, queued = cluster.api(
        "POST", "/v1/jobs", {"device_id": DEV, "command": ["true"], "submitter": "bob"}
    )
    assert status == 201 and queued["state"] == "queued", queued
    time.sleep(1.5)  # more than one periodic pass
    assert waiter.poll() is None, "drain --wait returned while the job still ran"
    flag.touch()
    out, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, (out, err, cluster.logs())
    assert out == f"draining {DEV}\nidle: {DEV}\n"
    assert f"waiting for {DEV} (held by tester, job {first_id})" in err
    assert first.wait(20) == 0
    time.sleep(2.5)  # the scheduler has run passes since the device went ready
    assert cluster.job(queued["id"])["state"] == "queued"
    assert running_on(cluster, DEV) is None
    device = cluster.api("GET", "/v1/devices")[1][0]["device"]
    assert device["state"] == "ready" and device["drain_reason"] == "driver upgrade"
    r = cluster.rc("undrain", DEV, token="atok")
    assert (r.returncode, r.stdout) == (0, f"undrained {DEV}\n"), r.stderr
    cluster.wait_job(queued["id"], lambda j: j["state"] == "succeeded")


def test_drain_wait_stops_on_ctrl_c_with_130_and_the_device_stays_draining(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    flag = tmp_path / "finish"
    cluster.popen_rc("run", "-d", DEV, "--", *wait_file_job(flag))
    wait_for(lambda: running_on(cluster, DEV), 15, "the job to run")
    waiter = cluster.popen_rc("drain", DEV, "--wait", token="atok")
    assert waiter.stderr is not None
    assert "waiting for" in waiter.stderr.readline()
    waiter.send_signal(signal.SIGINT)
    assert waiter.wait(10) == 130
    assert cluster.api("GET", "/v1/devices")[1][0]["device"]["draining"] is True
    flag.touch()


def test_a_nested_rc_run_returns_promptly_with_the_inner_exit_code(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    started = time.monotonic()
    inner = [RC, "run", "--", "sh", "-c", 'echo "inner on $RC_DEVICE"; exit 3']
    r = cluster.rc("run", "-d", DEV, "--", *inner, timeout=60)
    took = time.monotonic() - started
    assert r.returncode == 3, (r.stdout, r.stderr, cluster.logs())
    # The job's output is its stdout and stderr together: the inner rc's one line, then
    # the command's own.
    assert r.stdout.splitlines() == [
        re.match(
            r"rc: inside job \S+: running directly under its lease on box:gpu0 .*", r.stdout
        ).group(0),  # type: ignore[union-attr]
        f"inner on {DEV}",
    ], r.stdout
    assert took < 20, took
    # The pinned form nests too; only the outer job ever existed per run.
    pinned = cluster.rc("run", "-d", DEV, "--", RC, "run", "-d", DEV, "--", "false")
    assert pinned.returncode == 1, pinned.stderr
    _, listing = cluster.api("GET", "/v1/jobs?limit=50")
    assert len(listing["jobs"]) == 2


def granted_after(job: dict[str, object], epoch: int) -> bool:
    """Granted after the lease of ``epoch``, or not granted at all (still queued)."""
    mine = job.get("lease_epoch")
    return not isinstance(mine, int) or mine > epoch


def test_aging_lets_a_low_priority_job_through_a_stream_of_higher_ones(
    cluster: Cluster, tmp_path: Path
) -> None:
    # One step per second: the low job (priority -1) ties the stream (priority 1)
    # after 2 s of waiting and, queued earlier, goes first, while stream jobs wait.
    cluster.start_controller("--priority-aging", "1s")
    cluster.start_worker("box", ["gpu0"])
    flag = tmp_path / "finish"
    blocker = cluster.popen_rc("run", "-d", DEV, "--", *wait_file_job(flag))
    wait_for(lambda: running_on(cluster, DEV), 15, "the first job to run")

    def submit(priority: int, command: list[str]) -> str:
        body = {"device_id": DEV, "command": command, "submitter": "s", "priority": priority}
        status, job = cluster.api("POST", "/v1/jobs", body)
        assert status == 201, job
        return str(job["id"])

    low = submit(-1, ["true"])
    stop_stream = threading.Event()
    stream: list[tuple[str, float]] = []  # (job ID, local instant it was submitted)

    def feed() -> None:
        while not stop_stream.is_set() and len(stream) < 200:
            # Faster than the device works them off: the higher queue only grows.
            stream.append((submit(1, ["sleep", "0.5"]), time.monotonic()))
            stop_stream.wait(0.2)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        time.sleep(0.5)
        flag.touch()  # the device frees; from now on the stream competes with the low job
        wait_for(lambda: cluster.job(low)["state"] != "queued", 40, "the low job to be placed")
        placed_at = time.monotonic()
        low_job = cluster.wait_job(low, lambda j: j["state"] == "succeeded", timeout=40)
        assert low_job["exit_code"] == 0
    finally:
        stop_stream.set()
        feeder.join(10)
    assert blocker.wait(20) == 0
    # Lease epochs order the grants (EXT-EPOCH-1). Stream jobs submitted well before the
    # low job was placed but granted after it were overtaken: under strict priority
    # every one of them would have gone first.
    overtaken = [
        i
        for i, at in stream
        if at < placed_at - 0.5 and granted_after(cluster.job(i), low_job["lease_epoch"])
    ]
    assert overtaken, [(cluster.job(i).get("lease_epoch"), at - placed_at) for i, at in stream]


def test_a_one_megabyte_job_under_a_64k_cap_keeps_head_and_tail(cluster: Cluster) -> None:
    cluster.start_controller("--max-log-bytes", "64KiB")
    cluster.start_worker("box", ["gpu0"])
    lines = 80_000  # 13 bytes each: 1,040,000 bytes
    script = f"import sys\nfor i in range({lines}): sys.stdout.write('line %07d\\n' % i)\n"
    r = cluster.rc("run", "-d", DEV, "--", sys.executable, "-c", script, timeout=60)
    assert r.returncode == 0, (r.stderr, cluster.logs())
    job_id = re.search(r"rc: job (\S+) on", r.stderr).group(1)  # type: ignore[union-attr]
    full = "".join(f"line {i:07d}\n" for i in range(lines)).encode()
    logs = cluster.rc("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    got = logs.stdout.encode()
    head, tail = 32 * 1024, 64 * 1024 - 32 * 1024 - 256
    assert len(got) <= 64 * 1024
    assert got[:head] == full[:head]
    m = re.compile(rb"\n\[rc: (\d+) bytes of output dropped here: [^\]\n]*\]\n").match(got, head)
    assert m is not None, got[head : head + 300]
    assert int(m.group(1)) == len(full) - head - tail
    assert got[m.end() :] == full[-tail:]
    # rc run followed the same stored view: the head live, the rest when the job ended.
    assert r.stdout.encode() == got
    stop(cluster.procs[-1])
