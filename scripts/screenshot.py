"""Take ``docs/dashboard.png``: the dashboard over a busy fleet, from real processes.

A real ``rc serve`` and two real ``rc worker`` processes on loopback (six devices, GPU
facts from a drop-in probe), a few running jobs, a hold, a queue and one device out of
the pool after a fault report; then headless Chromium signs in and photographs the
page. Everything started here is stopped by PID before it exits.

    .venv/bin/python scripts/screenshot.py [OUTPUT.png]

It reuses the end-to-end suite's process and browser helpers (``tests/e2e``), so it
needs the dev extra and Debian's chromium and chromium-driver.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from e2e.browser import browser  # noqa: E402
from e2e.cluster import Cluster, free_port, kill_job_processes, stop, wait_for  # noqa: E402

HOSTS = {
    "gpubox-a": ("NVIDIA H100 80GB HBM3", "81559", ["gpu0", "gpu1", "gpu2", "gpu3"]),
    "gpubox-b": ("NVIDIA A100-SXM4-40GB", "40960", ["gpu0", "gpu1"]),
}


def probe(tmp: Path, host: str) -> Path:
    """A drop-in probe answering what nvidia-smi would on that host (worker PROBE-012)."""
    model, vram, names = HOSTS[host]
    facts: dict[str, str] = {}
    for i, name in enumerate(names):
        facts |= {
            f"{name}.vendor": "nvidia",
            f"{name}.model": model,
            f"{name}.vram": vram + "M",
            f"{name}.vram_free": str(int(vram) - 300 - 700 * i) + "M",
            f"{name}.driver": "550.54.15",
        }
    d = tmp / f"probe-{host}"
    d.mkdir()
    script = d / "10-gpu"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(facts)}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return d


def programs(tmp: Path) -> Path:
    """Stand-ins for the fleet's programs: each says a line and sleeps, so it keeps running."""
    d = tmp / "bin"
    d.mkdir()
    for name in ("train", "evaluate", "bench-attention", "finetune"):
        script = d / name
        script.write_text(f'#!/bin/sh\necho "{name} started: $*"\nexec sleep 3600\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return d


def submit(c: Cluster, body: dict[str, object]) -> str:
    status, job = c.api("POST", "/v1/jobs", body)
    if status != 201:
        raise SystemExit(f"submit refused ({status}): {job}")
    return str(job["id"])


def fleet(c: Cluster) -> list[str]:
    """Busy work on the fleet; returns the job IDs to end afterwards."""
    jobs = [
        submit(
            c,
            {
                "device_id": "gpubox-a:gpu0",
                "submitter": "alice",
                "command": ["train", "--config", "configs/llama-7b.yaml", "--epochs", "3"],
            },
        ),
        submit(
            c,
            {
                "device_id": "gpubox-a:gpu1",
                "submitter": "bob",
                "command": [
                    "evaluate",
                    "--suite",
                    "long-context",
                    "--checkpoint",
                    "runs/0412/step-9000",
                ],
            },
        ),
        submit(
            c,
            {
                "device_id": "gpubox-b:gpu0",
                "submitter": "carol",
                "command": ["bench-attention", "--seq", "8192"],
            },
        ),
        submit(
            c,
            {
                "device_id": "gpubox-a:gpu2",
                "submitter": "dave",
                "kind": "hold",
                "max_runtime_seconds": 7200,
                "reason": "profiling the new kernel",
            },
        ),
    ]
    for j in jobs:
        c.wait_job(j, lambda job: job["state"] == "running", 30)
    # The queue: two jobs pinned to busy devices.
    jobs += [
        submit(
            c,
            {
                "device_id": "gpubox-a:gpu0",
                "submitter": "erin",
                "command": ["finetune", "--lr", "3e-5"],
            },
        ),
        submit(
            c,
            {
                "device_id": "gpubox-b:gpu0",
                "submitter": "bob",
                "command": ["bench-attention", "--seq", "16384"],
            },
        ),
    ]
    # One device out of the pool: its worker's verify step reported a leftover process.
    status, body = c.api(
        "POST",
        "/v1/devices/gpubox-b:gpu1/fault",
        {"reason": "verify failed: 1 process still holds the device (pid 48213, python)"},
        token="wtok",
    )
    if status != 200:
        raise SystemExit(f"fault report refused ({status}): {body}")
    return jobs


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png"
    tmp = Path(tempfile.mkdtemp(prefix="rc-shot-"))
    c = Cluster(tmp=tmp, port=free_port())
    jobs: list[str] = []
    try:
        c.start_controller()
        path = f"{programs(tmp)}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        for host, (_, _, names) in HOSTS.items():
            c.start_worker(
                host, names, extra=f"probe_dir: {probe(tmp, host)}\n", env={"PATH": path}
            )
        jobs = fleet(c)
        with browser(tmp / "chromedriver.log", width=1280, height=900) as b:
            from selenium.webdriver.common.by import By

            b.driver.get(c.url + "/")
            b.wait(lambda: b.js("return !document.getElementById('gate').hidden"), 10, "the gate")
            b.driver.find_element(By.ID, "gate-token").send_keys("ctok")
            b.driver.find_element(By.CSS_SELECTOR, "#gate-form button").click()
            b.wait(lambda: b.text("#fresh") == "live", 10, "the first snapshot")
            b.driver.find_element(By.ID, "identity").send_keys("alice")
            b.wait(lambda: "out of the pool" in b.text("#fleet"), 10, "the unhealthy device")
            time.sleep(1.5)  # let a few seconds of elapsed time show
            height = int(b.js("return document.documentElement.scrollHeight"))
            b.driver.set_window_size(1280, min(max(height + 40, 900), 2400))
            time.sleep(0.5)
            out.parent.mkdir(parents=True, exist_ok=True)
            b.driver.save_screenshot(str(out))
        print(f"wrote {out}")
        return 0
    finally:
        for j in jobs:
            c.api("POST", f"/v1/jobs/{j}/kill", {"submitter": "admin"}, token="atok")
        for j in jobs:
            kill_job_processes(j)
        for proc in reversed(c.procs):
            stop(proc)
        wait_for(lambda: all(p.poll() is not None for p in c.procs), 20, "every process stopped")


if __name__ == "__main__":
    sys.exit(main())
