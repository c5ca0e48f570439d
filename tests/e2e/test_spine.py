"""The lease spine end to end: rc serve, rc worker and rc run as real processes."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .cluster import RC, Cluster, free_port, stop, wait_for

JOB_LINE = re.compile(r"rc: job (\S+) on (\S+)")


def test_forty_jobs_from_eight_clients_never_share_a_device(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Exclusivity: every job takes `flock -n` on its device's file and fails loudly if it
    cannot; 40 jobs from 8 concurrent `rc run` over 2 devices on 2 workers (STORE-180)."""
    cluster.start_controller()
    cluster.start_worker("hosta", ["gpu0"])
    cluster.start_worker("hostb", ["gpu0"])
    locks = tmp_path / "locks"
    locks.mkdir()
    # flock -E 99: exit 99 when the lock is already held, i.e. two jobs share a device.
    script = (
        f'flock -n -E 99 "{locks}/$RC_DEVICE" sh -c \'sleep 0.05; exit "$0"\' "$1"; rc=$?; '
        '[ "$rc" = 99 ] && echo "VIOLATION on $RC_DEVICE"; exit "$rc"'
    )

    def one(i: int) -> tuple[int, int, str, str]:
        want = i % 7
        r = cluster.rc("run", "--", "sh", "-c", script, "x", str(want), timeout=120)
        return want, r.returncode, r.stdout, r.stderr

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(40)))
    violations = [r for r in results if "VIOLATION" in r[2] or r[1] == 99]
    assert not violations, (violations, cluster.logs())
    for want, got, _out, err in results:
        assert got == want, (want, got, err)
        assert JOB_LINE.search(err), err
    devices_used = {JOB_LINE.search(r[3]).group(2) for r in results}  # type: ignore[union-attr]
    assert devices_used == {"hosta:gpu0", "hostb:gpu0"}


def test_queue_position_no_wait_and_timeout(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    holder = cluster.popen_rc("run", "-d", "box:gpu0", "--", "sleep", "30")
    wait_for(lambda: cluster.api("GET", "/v1/state")[1]["jobs"], 10, "the first job to run")

    # --no-wait is refused at once (CLI-104) and recorded as killed (API-042 step 4).
    t0 = time.monotonic()
    r = cluster.rc("run", "-d", "box:gpu0", "--no-wait", "--", "true")
    assert r.returncode == 1 and "busy" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 5
    _, listing = cluster.api("GET", "/v1/jobs?state=killed")
    assert any(j["kill_reason"] == "no-wait: device busy" for j in listing["jobs"])

    # --timeout gives up waiting in the queue and cancels the job (CLI-107).
    r = cluster.rc("run", "-d", "box:gpu0", "--timeout", "1500ms", "--", "true")
    assert r.returncode == 1, r.stderr
    assert "rc: queued at position 1 for box:gpu0" in r.stderr
    assert re.search(r"rc: cancelled queued job \S+", r.stderr), r.stderr
    assert "gave up waiting for box:gpu0" in r.stderr
    cancelled = re.search(r"cancelled queued job (\S+)", r.stderr).group(1)  # type: ignore[union-attr]
    assert cluster.job(cancelled)["state"] == "killed"
    stop(holder, signal.SIGKILL)


def test_kill_running_and_queued_with_ownership(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    running = cluster.api(
        "POST",
        "/v1/jobs",
        {"device_id": "box:gpu0", "command": ["sleep", "60"], "submitter": "alice"},
    )[1]
    queued = cluster.api(
        "POST", "/v1/jobs", {"device_id": "box:gpu0", "command": ["true"], "submitter": "alice"}
    )[1]
    cluster.wait_job(running["id"], lambda j: j["state"] == "running")
    assert cluster.job(queued["id"])["state"] == "queued"

    # Another submitter is refused (API-046), an admin is not.
    r = cluster.rc("kill", queued["id"], "--as", "bob")
    assert r.returncode == 1 and "not_job_owner" in r.stderr, r.stderr
    r = cluster.rc("kill", queued["id"], "--as", "bob", token="atok")
    assert r.returncode == 0, r.stderr
    job = cluster.job(queued["id"])
    assert job["state"] == "killed" and job["kill_reason"] == "killed by admin override (as bob)"

    # As docs/agents.md says: the owner's kill of a queued job records who killed it
    # (CLI-132, STORE-043) ...
    mine = cluster.api(
        "POST", "/v1/jobs", {"device_id": "box:gpu0", "command": ["true"], "submitter": "alice"}
    )[1]
    assert cluster.job(mine["id"])["state"] == "queued"
    r = cluster.rc("kill", mine["id"], "--as", "alice")
    assert r.returncode == 0, r.stderr
    job = cluster.job(mine["id"])
    assert job["state"] == "killed" and job["kill_reason"] == "killed by alice", job

    # ... while a running job killed by its owner ends with the worker's reason (WRK-096).
    r = cluster.rc("kill", running["id"], "--as", "alice")
    assert r.returncode == 0, r.stderr
    job = cluster.wait_job(running["id"], lambda j: j["state"] not in ("assigned", "running"))
    assert job["state"] == "killed" and job["kill_reason"] == "cancelled", job
    assert job["exit_code"] == 143, job  # sleep ended by the SIGTERM
    # The device returns to the pool.
    wait_for(
        lambda: cluster.api("GET", "/v1/devices")[1][0]["device"]["state"] == "ready",
        10,
        "device ready",
    )


def test_ctrl_c_cancels_while_queued_and_detaches_while_running(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    first = cluster.popen_rc("run", "-d", "box:gpu0", "--", "sleep", "30")
    wait_for(lambda: cluster.api("GET", "/v1/state")[1]["jobs"], 10, "the first job to run")
    job_id = cluster.api("GET", "/v1/state")[1]["jobs"][0]["id"]

    second = cluster.popen_rc("run", "-d", "box:gpu0", "--", "true")
    wait_for(lambda: cluster.api("GET", "/v1/state")[1]["queued"], 10, "the second job to queue")
    queued_id = cluster.api("GET", "/v1/state")[1]["queued"][0]["id"]
    time.sleep(0.3)
    second.send_signal(signal.SIGINT)
    _, err = second.communicate(timeout=15)
    assert second.returncode == 130, err
    assert cluster.job(queued_id)["state"] == "killed"

    # Ctrl-C while running only detaches: the job keeps running (CLI-113).
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=15)
    assert first.returncode == 130, err
    assert "STILL RUNNING" in err and job_id in err
    assert cluster.job(job_id)["state"] == "running"


def test_worker_sigterm_kills_its_job_and_reports_it(cluster: Cluster) -> None:
    cluster.start_controller()
    worker = cluster.start_worker("box", ["gpu0"])
    job = cluster.api(
        "POST", "/v1/jobs", {"device_id": "box:gpu0", "command": ["sleep", "60"], "submitter": "t"}
    )[1]
    cluster.wait_job(job["id"], lambda j: j["state"] == "running")
    time.sleep(0.3)
    assert stop(worker, signal.SIGTERM, timeout=30) == 0
    final = cluster.job(job["id"])
    assert final["state"] == "killed" and final["kill_reason"] == "cancelled: worker stopped", final


def test_output_and_exit_code_stream_back(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu3"])
    r = cluster.rc(
        "run", "--", "sh", "-c", 'echo "out $RC_DEVICE $CUDA_VISIBLE_DEVICES"; echo err >&2; exit 3'
    )
    assert r.returncode == 3
    assert "out box:gpu3 3" in r.stdout and "err" in r.stdout
    assert JOB_LINE.search(r.stderr)


def test_rc_up_serves_rc_run_from_another_process(tmp_path: Path) -> None:
    """`rc up` then `rc run -- echo hi` with nothing exported but HOME (EXT-UP)."""
    import os

    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RC_") and k != "XDG_CONFIG_HOME"
    }
    env["HOME"] = str(tmp_path)
    env.pop("XDG_DATA_HOME", None)
    up = subprocess.Popen(
        [RC, "up", "--addr", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        cfg = tmp_path / ".config/rc/config.yaml"
        wait_for(cfg.exists, 20, "rc up to write the user config")

        def ran() -> subprocess.CompletedProcess[str] | None:
            r = subprocess.run(
                [RC, "run", "--", "echo", "hi"], env=env, capture_output=True, text=True, timeout=30
            )
            return r if r.returncode == 0 else None

        r = wait_for(ran, 20, "rc run through rc up", every=0.3)
        assert r.stdout == "hi\n"
        assert (cfg.stat().st_mode & 0o777) == 0o600
    finally:
        assert stop(up, signal.SIGINT, timeout=30) == 0
    # EXT-UP-1: no XDG_DATA_HOME, so the state is under ~/.local/share/rc.
    state = tmp_path / ".local/share/rc"
    assert (state / "up-tokens").is_file() and (state / "rc.db").is_file()
    banner = up.stderr.read().decode() if up.stderr else ""
    assert f"rc: controller on http://127.0.0.1:{port} (data {state}); devices: " in banner
    # EXT-UP-4: where the dashboard is, which token it wants, and what to try (no GPU here).
    dashboard = (
        f"rc: dashboard: http://127.0.0.1:{port}/ (paste the admin token from"
        f" {state / 'up-tokens'} to act on anything, or the client token in {cfg} for your"
        " own jobs)\n"
    )
    try_line = "rc: try:  rc run -- hostname   |   rc devices   |   rc ps   (Ctrl-C stops)\n"
    assert dashboard + try_line in banner, banner
