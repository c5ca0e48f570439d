"""How soon a job whose worker dies runs again on another worker (EXT-RETRY-1).

One ``rc serve`` (SQLite) with the reaper's timings shortened through ``RC_TEST_TIMINGS``
(a worker silent ``--unhealthy-after`` seconds is written off; a sweep every 0.5 s). Each
round starts a worker, runs a ``--retries 1`` job on it, starts a second worker, then
SIGKILLs the first worker and the job's process. Measured: the kill → the job back in the
queue as attempt 2 (the write-off: the controller's log line), and that → attempt 2's
process started on the second worker (its own wall-clock stamp), the figure the issue bounds
at 2 s.

Usage: ``python bench/retry_lost.py [--rounds 5] [--unhealthy-after 6] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from controllers import TOKENS, _get, _wait
from latency import RC, free_port, summary


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": "Bearer ctok", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Bench:
    def __init__(self, tmp: Path, unhealthy_after: float) -> None:
        self.tmp = tmp
        self.url = f"http://127.0.0.1:{free_port()}"
        timings = f"sweep_interval=0.5,grace=2,unhealthy_after={unhealthy_after},hold_off=2"
        self.server = subprocess.Popen(
            [RC, "serve", "--addr", self.url[len("http://") :], "--data", str(tmp / "data")],
            env=dict(os.environ, RC_TOKENS=TOKENS, RC_TEST_TIMINGS=timings),
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "controller.log", "ab"),  # noqa: SIM115
        )
        _wait(lambda: _get(self.url, "/v1/state") is not None, "the controller")

    def worker(self, host: str) -> subprocess.Popen[bytes]:
        cfg = self.tmp / f"{host}.yaml"
        cfg.write_text(
            f"controller_url: {self.url}\ntoken: wtok\nhost: {host}\n"
            f"state_dir: {self.tmp / host}\ndevices: [slot0]\nheartbeat_interval: 1s\n"
        )
        proc = subprocess.Popen(
            [RC, "worker", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / f"{host}.log", "ab"),  # noqa: SIM115
            start_new_session=True,  # its jobs' groups are killed with it below
        )
        _wait(lambda: self._ready(f"{host}:slot0"), f"worker {host}")
        return proc

    def _ready(self, device_id: str) -> bool:
        views = _get(self.url, "/v1/devices") or []
        return any(
            v["device"]["id"] == device_id and v["device"]["state"] == "ready" for v in views
        )

    def round(self, i: int) -> tuple[float, float]:
        victim = self.worker(f"v{i}")
        stamp, flag = self.tmp / f"started{i}", self.tmp / f"once{i}"
        script = (
            f"if [ -e {flag} ]; then date +%s.%N > {stamp}; else touch {flag}; exec sleep 600; fi"
        )
        # The victim's device is the only one: the first attempt runs there.
        body = {"command": ["sh", "-c", script], "submitter": "b", "retries": 1}
        job = _post(self.url, "/v1/jobs", body)
        job_id = job["id"]
        _wait(lambda: flag.exists(), "the first attempt")
        standby = self.worker(f"s{i}")
        os.killpg(victim.pid, signal.SIGKILL)
        killed = time.time()
        victim.wait(10)
        subprocess.run(["pkill", "-KILL", "-f", "exec sleep 600|^sleep 600"], check=False)

        def requeued() -> bool:
            view = _get(self.url, f"/v1/jobs/{job_id}") or {}
            return bool(view.get("job", {}).get("attempt") == 2)

        _wait(requeued, "the write-off", bound=60)
        _wait(lambda: stamp.exists() and stamp.read_text().strip() != "", "attempt 2", bound=30)
        started = float(stamp.read_text())
        _stop(standby)
        queued = self._logged(f"job {job_id}: attempt 1 lost")
        return queued - killed, started - queued

    def _logged(self, words: str) -> float:
        """The wall-clock time of the controller's log line holding ``words``."""
        for line in (self.tmp / "controller.log").read_text().splitlines():
            if words in line:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()
        raise SystemExit(f"no log line {words!r}")

    def close(self) -> None:
        _stop(self.server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--unhealthy-after", type=float, default=6.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rounds = []
    for i in range(args.rounds):
        # A controller of its own each round: the last round's stopped worker still looks ready.
        with tempfile.TemporaryDirectory() as d:
            bench = Bench(Path(d), args.unhealthy_after)
            try:
                rounds.append(bench.round(i))
            finally:
                bench.close()
    to_queue = summary([r[0] for r in rounds])
    to_run = summary([r[1] for r in rounds])
    print(f"unhealthy-after {args.unhealthy_after:g} s, {args.rounds} rounds")
    print(
        "kill -> back in the queue (write-off): "
        f"{to_queue['min']:.2f} / {to_queue['median']:.2f} / {to_queue['max']:.2f} s"
    )
    print(
        "back in the queue -> running on the other worker: "
        f"{to_run['min']:.3f} / {to_run['median']:.3f} / {to_run['max']:.3f} s (bound 2 s)"
    )
    if args.json:
        args.json.write_text(json.dumps({"to_queue": to_queue, "to_run": to_run}, indent=2))


if __name__ == "__main__":
    main()
