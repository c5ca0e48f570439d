"""Lease hooks and verify scripts end to end: real `rc serve`, `rc worker`, scripts.

Hooks append one line per run to a log (``event job``), so the tests count them; the
controller is the judge of what a failing verify or acquire hook did to the device.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from .cluster import Cluster, stop, wait_for


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def hook(tmp: Path, name: str) -> str:
    return script(tmp / name, f'echo "$RC_EVENT $RC_JOB_ID" >> "{tmp / "hooks.log"}"')


def hook_runs(tmp: Path) -> list[str]:
    log = tmp / "hooks.log"
    return log.read_text().splitlines() if log.exists() else []


def start_worker(cluster: Cluster, device: str, extra: str = "") -> Any:
    proc = cluster.start_worker("box", [device], extra=extra, wait=False)
    wait_for(lambda: device_view(cluster) is not None, 15, "the worker to register")
    return proc


def device_view(cluster: Cluster, device_id: str = "box:gpu0") -> dict[str, Any] | None:
    """The device's state, with the view's ``quarantine_reason`` beside it."""
    status, views = cluster.api("GET", "/v1/devices")
    if status != 200:
        return None
    for v in views:
        if v["device"]["id"] == device_id:
            return {**v["device"], "quarantine_reason": v.get("quarantine_reason")}
    return None


def submit(cluster: Cluster, command: list[str]) -> str:
    status, body = cluster.api(
        "POST", "/v1/jobs", {"device_id": "box:gpu0", "command": command, "submitter": "e2e"}
    )
    assert status in (200, 201), body
    return str(body["id"])


def test_burst_of_jobs_runs_one_acquire_and_one_release(cluster: Cluster, tmp_path: Path) -> None:
    # HOOK-023: back-to-back jobs within the linger share one acquire and one release.
    cluster.start_controller()
    acquire, release = hook(tmp_path, "acq"), hook(tmp_path, "rel")
    start_worker(
        cluster,
        f"{{name: gpu0, on_acquire: {acquire}, on_release: {release}, release_linger: 2s}}",
        f"verify_dir: {tmp_path / 'no-verify'}\n",
    )
    wait_for(lambda: hook_runs(tmp_path) == ["release "], 10, "the start-up release pass")
    n = 6
    ids = [submit(cluster, ["sh", "-c", "sleep 0.1"]) for _ in range(n)]
    for job_id in ids:
        cluster.wait_job(job_id, lambda j: j["state"] == "succeeded", timeout=30)
    wait_for(lambda: len(hook_runs(tmp_path)) == 3, 10, "the release after the linger")
    time.sleep(0.5)
    runs = hook_runs(tmp_path)[1:]
    acquires = sum(r.startswith("acquire ") for r in runs)
    releases = sum(r.startswith("release ") for r in runs)
    print(f"\nburst of {n} back-to-back jobs on one device: {acquires} acquire, {releases} release")
    assert runs == [f"acquire {ids[0]}", f"release {ids[-1]}"], cluster.logs()


def test_failing_verify_takes_the_device_out_before_the_report(
    cluster: Cluster, tmp_path: Path
) -> None:
    # VERIFY-008, WRK-074: the fault lands before the terminal report, so the job
    # queued behind never starts on the dirty device; the job keeps its exit code.
    cluster.start_controller()
    verify_d = tmp_path / "verify.d"
    verify_d.mkdir()
    dirty = tmp_path / "dirty"
    script(
        verify_d / "10-clean",
        f'[ -e "{dirty}" ] && {{ echo "leftover memory" >&2; exit 1; }}; exit 0',
    )
    start_worker(cluster, "gpu0", f"verify_dir: {verify_d}\n")
    # A clean job first: verify passes, the device goes back to the pool.
    clean = submit(cluster, ["true"])
    cluster.wait_job(clean, lambda j: j["state"] == "succeeded")
    exit_file = tmp_path / "exit-at"
    first = submit(
        cluster,
        ["sh", "-c", f'sleep 1; touch "{dirty}"; date +%s.%N > "{exit_file}"; exit 4'],
    )
    cluster.wait_job(first, lambda j: j["state"] == "running")
    second = submit(cluster, ["touch", str(tmp_path / "second-ran")])

    observations: list[tuple[float, str, str]] = []
    stop_watch = threading.Event()

    def watch() -> None:
        while not stop_watch.is_set():
            job = cluster.job(first)
            dev = device_view(cluster) or {}
            observations.append((time.time(), str(job["state"]), str(dev.get("state"))))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        done = cluster.wait_job(first, lambda j: j["state"] not in ("assigned", "running"))
        time.sleep(2)
    finally:
        stop_watch.set()
        watcher.join(10)
    assert done["state"] == "failed" and done["exit_code"] == 4, done
    dev = device_view(cluster)
    assert dev is not None and dev["state"] == "unhealthy", dev
    assert str(dev.get("quarantine_reason", "")).startswith(
        "verify failed: 10-clean: exited 1: leftover memory"
    ), dev
    # Whenever the first job was seen terminal, the device was already out of the pool.
    terminal_seen = [o for o in observations if o[1] == "failed"]
    assert terminal_seen and all(o[2] == "unhealthy" for o in terminal_seen), observations
    assert cluster.job(second)["state"] == "queued"
    assert not (tmp_path / "second-ran").exists()
    exited_at = float(exit_file.read_text())
    out_at = next(t for t, _, d in observations if d == "unhealthy")
    print(
        f"\nfailing verify: job exit -> device out of the pool in {1000 * (out_at - exited_at):.0f} ms"
        " (observed by polling the controller every ~5 ms)"
    )
    # The fault needs an admin; after the clear the queued job runs (verify passes now).
    dirty.unlink()
    status, _ = cluster.api("POST", "/v1/devices/box:gpu0/clear", {}, token="atok")
    assert status == 200
    cluster.wait_job(second, lambda j: j["state"] == "succeeded")


def test_failed_acquire_hook_faults_the_device(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_controller()  # HOOK-012
    acquire = script(tmp_path / "acq", "echo 'service would not stop'; exit 2")
    start_worker(
        cluster, f"{{name: gpu0, on_acquire: {acquire}}}", f"verify_dir: {tmp_path / 'none'}\n"
    )
    marker = tmp_path / "ran"
    job_id = submit(cluster, ["touch", str(marker)])
    job = cluster.wait_job(job_id, lambda j: j["state"] not in ("queued", "assigned", "running"))
    reason = f"acquire hook failed: hook {acquire}: exited 2\nservice would not stop\n"
    assert job["state"] == "failed" and job["kill_reason"] == reason, job
    assert not marker.exists()
    dev = device_view(cluster)
    assert dev is not None and dev["state"] == "unhealthy", dev
    assert dev["quarantine_reason"] == reason  # the fault's detail (API-039)


def test_restart_runs_the_release_a_killed_worker_never_ran(
    cluster: Cluster, tmp_path: Path
) -> None:
    # HOOK-030: the start-up release pass heals a worker that died holding a device.
    cluster.start_controller()
    acquire, release = hook(tmp_path, "acq"), hook(tmp_path, "rel")
    device = f"{{name: gpu0, on_acquire: {acquire}, on_release: {release}, release_linger: 1h}}"
    extra = f"verify_dir: {tmp_path / 'none'}\n"
    worker = start_worker(cluster, device, extra)
    wait_for(lambda: hook_runs(tmp_path) == ["release "], 10, "the first start-up pass")
    job_id = submit(cluster, ["true"])
    cluster.wait_job(job_id, lambda j: j["state"] == "succeeded")
    assert hook_runs(tmp_path) == ["release ", f"acquire {job_id}"]
    stop(worker, signal.SIGKILL)  # the linger never ends: its release never runs
    start_worker(cluster, device, extra)
    wait_for(lambda: len(hook_runs(tmp_path)) == 3, 15, "the start-up release pass")
    assert hook_runs(tmp_path) == ["release ", f"acquire {job_id}", "release "], cluster.logs()
