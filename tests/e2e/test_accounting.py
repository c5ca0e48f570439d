"""Accounting with real processes (EXT-ACCT): ``rc serve``, ``rc worker`` and ``rc run``.

The worker runs with the fake ``nvidia-smi`` of ``tests/data/nvidia_smi_sampling/``
first on its ``PATH`` (``RC_TEST_SMI_SAMPLING`` picks the scenario): readings reach the
job's view, ``rc jobs``, ``rc usage`` and ``/metrics``; a hanging ``nvidia-smi`` never
holds a job's end back; and the figures ride in the worker's outbox across a
controller outage and a worker restart. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

from .cluster import Cluster, Json, stop, wait_for

FAKE_SMI = Path(__file__).resolve().parent.parent / "data" / "nvidia_smi_sampling"
HOST = "acct"
MIB = 1 << 20
GPU_FIELDS = {"gpu_util_mean", "gpu_mem_peak_bytes", "samples"}


def smi_env(tmp: Path, scenario: str, **more: str) -> dict[str, str]:
    return {
        "PATH": f"{FAKE_SMI}{os.pathsep}{os.environ.get('PATH', '')}",
        "RC_TEST_SMI_SAMPLING": scenario,
        "RC_TEST_SMI_STATE": str(tmp / f"smi-{scenario}"),
        **more,
    }


def submit(cluster: Cluster, device: str, script: str) -> str:
    status, job = cluster.api(
        "POST",
        "/v1/jobs",
        {"command": ["sh", "-c", script], "device_id": device, "submitter": "tester"},
    )
    assert status == 201, job
    return str(job["id"])


def terminal(job: dict[str, Json]) -> bool:
    return job["state"] in ("succeeded", "failed", "killed", "lost")


def test_readings_reach_the_job_rc_jobs_rc_usage_and_metrics(cluster: Cluster) -> None:
    # EXT-ACCT-1..3 end to end: the busy scenario reads 40/60/80 % on gpu0, 100 % on gpu1.
    cluster.start_controller()
    cluster.start_worker(
        HOST,
        ["gpu0", "gpu1"],
        extra="gpu_sample_interval: 200ms\n",
        env=smi_env(cluster.tmp, "busy"),
    )
    run = cluster.rc("run", "-d", f"{HOST}:gpu0", "--", "sh", "-c", "sleep 1.5; echo trained")
    assert run.returncode == 0, (run.stderr, cluster.logs())
    assert run.stdout == "trained\n"
    found = re.search(r"job (\S+) on ", run.stderr)
    assert found, run.stderr
    job = cluster.job(found.group(1))
    assert set(job) >= GPU_FIELDS, (job, cluster.logs())
    assert 40 <= job["gpu_util_mean"] <= 80 and job["samples"] >= 1
    assert job["gpu_mem_peak_bytes"] in (10240 * MIB, 20480 * MIB)
    other = submit(cluster, f"{HOST}:gpu1", "sleep 1")
    cluster.wait_job(other, terminal)

    listed = cluster.rc("jobs", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    by_id = {j["id"]: j for j in json.loads(listed.stdout)}
    assert by_id[job["id"]]["gpu_util_mean"] == job["gpu_util_mean"]

    usage = cluster.rc("usage", "--since", "1d", "--by", "device", "-o", "json")
    assert usage.returncode == 0, usage.stderr
    answer = json.loads(usage.stdout)
    assert sorted(g["group"] for g in answer["groups"]) == [f"{HOST}:gpu0", f"{HOST}:gpu1"]
    assert answer["total"]["jobs"] == 2 and "gpu_hours" in answer["total"]
    table = cluster.rc("usage")
    assert table.returncode == 0 and table.stdout.splitlines()[1].split()[:2] == ["tester", "2"]

    req = urllib.request.Request(cluster.url + "/metrics", headers={"Authorization": "Bearer ctok"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        metrics = resp.read().decode()
    assert f'rc_device_held_seconds_total{{device="{HOST}:gpu0",submitter="tester"}}' in metrics
    assert f'rc_job_gpu_util{{device="{HOST}:gpu1",submitter="tester"}} 100.0' in metrics


def test_a_hanging_nvidia_smi_never_holds_a_job_back(cluster: Cluster) -> None:
    # EXT-ACCT-1: each reading bounded by probe_timeout (30 s here), and the job's end
    # and report never wait for one.
    cluster.start_controller()
    cluster.start_worker(
        HOST,
        ["gpu0"],
        extra="gpu_sample_interval: 100ms\nprobe_timeout: 30s\n",
        env=smi_env(cluster.tmp, "hang"),
    )
    started = time.monotonic()
    run = cluster.rc("run", "-d", f"{HOST}:gpu0", "--", "sh", "-c", "sleep 0.5; exit 7")
    took = time.monotonic() - started
    assert run.returncode == 7, (run.stderr, cluster.logs())
    assert took < 20, took  # well inside the 30 s a hanging reading may take
    (job,) = [j for j in json.loads(cluster.rc("jobs", "-o", "json").stdout)]
    assert job["state"] == "failed" and not GPU_FIELDS & set(job)
    assert list((cluster.tmp / "smi-hang").iterdir())  # a reading was asked for, and hung
    # The reading that hung was cancelled with the job, its process group killed.
    wait_for(lambda: not smi_pids(cluster.tmp), 10, "the hanging nvidia-smi to be gone")


def smi_pids(tmp: Path) -> list[int]:
    """Live fake ``nvidia-smi`` processes started for this test (by its state directory)."""
    want = f"RC_TEST_SMI_STATE={tmp / 'smi-hang'}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"nvidia-smi" not in f.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_the_figures_survive_a_controller_outage_and_a_worker_restart(cluster: Cluster) -> None:
    # EXT-OUTBOX-1: the terminal report, figures included, waits on disk while the
    # controller is down, and a restarted worker re-sends it as written.
    cluster.start_controller()
    env = smi_env(cluster.tmp, "busy", RC_TEST_TIMINGS="shutdown_wait=1,abandon_wait=1")
    extra = "gpu_sample_interval: 200ms\n"
    worker = cluster.start_worker(HOST, ["gpu0"], extra=extra, env=env)
    job_id = submit(cluster, f"{HOST}:gpu0", "sleep 3; echo done")
    cluster.wait_job(job_id, lambda j: j["state"] == "running")
    assert cluster.controller is not None
    stop(cluster.controller)  # down while the job runs and ends
    outbox = cluster.tmp / f"state-{HOST}" / "outbox"

    def on_disk() -> list[dict[str, Json]]:
        return [json.loads(p.read_text()) for p in sorted(outbox.glob("*-status.json"))]

    (record,) = wait_for(on_disk, 30, "the terminal report on disk")
    assert set(record["body"]) >= GPU_FIELDS, record
    assert stop(worker, signal.SIGTERM) == 0  # the report stays on disk for the next start
    assert [r["body"] for r in on_disk()] == [record["body"]]
    cluster.start_controller()
    cluster.start_worker(HOST, ["gpu0"], extra=extra, env=env)
    job = cluster.wait_job(job_id, terminal, timeout=30)
    assert job["state"] == "succeeded", (job, cluster.logs())
    assert {k: job[k] for k in GPU_FIELDS} == {k: record["body"][k] for k in GPU_FIELDS}
