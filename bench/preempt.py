"""Submit to a victim's SIGTERM (EXT-PREEMPT-2), on loopback: target at most 1 s.

Starts a real ``rc serve`` (``--preempt-min-runtime 0``) and one ``rc worker`` with one
generic device. Each repeat starts a preemptible job that traps SIGTERM and writes the
instant it got it, submits a job that is not preemptible through the API, and measures from
just before that submit to the victim's SIGTERM; the waiting job then runs and the victim
runs again and ends. Figures are min/median/max over repeats.
Usage: ``python bench/preempt.py [--repeats 20] [--json results.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
TOKENS = "wtok:worker,ctok:client"
#: The victim: a second attempt ends at once; the first waits for its SIGTERM.
VICTIM = (
    'if [ -e "$0.ran" ]; then exit 0; fi; touch "$0.ran";'
    " trap 'date +%s.%N > \"$0\"; exit 143' TERM; while :; do sleep 0.05; done"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, body: object = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": "Bearer ctok", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
            return json.loads(raw) if raw else None

    def submit(self, command: list[str], **extra: object) -> str:
        body = {"command": command, "submitter": "bench", **extra}
        answer = self.call("POST", "/v1/jobs", body)
        return str(answer.get("job", answer)["id"])

    def state(self, job_id: str) -> str:
        return str(self.call("GET", f"/v1/jobs/{job_id}")["job"]["state"])


def one(api: Api, tmp: Path, n: int) -> float:
    termed = tmp / f"termed-{n}"
    victim = api.submit(["sh", "-c", VICTIM, str(termed)], preemptible=True)
    wait_for(lambda: Path(f"{termed}.ran").exists(), 20, "the victim to start")
    began = time.time()
    waiting = api.submit(["true"])
    wait_for(termed.exists, 10, "the victim's SIGTERM")
    wait_for(lambda: termed.read_text().strip(), 5, "the instant it was written")
    took = float(termed.read_text()) - began
    for job in (waiting, victim):
        wait_for(lambda: api.state(job) == "succeeded", 30, f"job {job} to succeed")  # noqa: B023
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        tmp = Path(where)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, RC_TOKENS=TOKENS)
        serve = [RC, "serve", "--addr", f"127.0.0.1:{port}", "--data", str(tmp / "data")]
        serve += ["--preempt-min-runtime", "0s", "--preempt-grace", "5s"]
        config = tmp / "worker.yaml"
        config.write_text(
            f"controller_url: {url}\ntoken: wtok\nhost: benchbox\nheartbeat_interval: 1s\n"
            f"state_dir: {tmp / 'state'}\ndevices:\n  - slot0\n"
        )
        log = open(tmp / "procs.log", "ab")  # noqa: SIM115 - closed below
        procs = [subprocess.Popen(serve, env=env, stdout=log, stderr=subprocess.STDOUT)]
        api = Api(url)
        try:
            wait_for(lambda: _answers(api), 15, "the controller")
            procs.append(
                subprocess.Popen([RC, "worker", "-c", str(config)], stdout=log, stderr=log)
            )
            wait_for(lambda: api.call("GET", "/v1/devices"), 15, "the worker")
            samples = [one(api, tmp, n) for n in range(args.repeats)]
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(15)
            log.close()
    figures = {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "repeats": len(samples),
    }
    print(
        f"submit -> victim SIGTERM: min {figures['min'] * 1000:.0f} ms, median"
        f" {figures['median'] * 1000:.0f} ms, max {figures['max'] * 1000:.0f} ms"
        f" over {len(samples)} (target <= 1000 ms)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"submit_to_sigterm_seconds": figures}, indent=2))


def _answers(api: Api) -> bool:
    try:
        api.call("GET", "/v1/state")
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
