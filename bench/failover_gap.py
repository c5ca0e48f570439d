"""How long a worker listing two controllers goes without starting a job when one dies
(EXT-PG-5).

Two ``rc serve`` on one PostgreSQL database, one ``rc worker`` with one device that lists
both. Each round waits until the worker long-polls one controller (its connection is
read from ``/proc``), kills a controller with SIGKILL, submits a job to the other at
once and measures the gap: the kill → the job's process started (its own wall-clock
stamp). ``polled`` rounds kill the controller the worker long-polls; ``other`` rounds,
the baseline, kill the one it does not. The killed controller is started again before
the next round. PostgreSQL comes from Debian's ``postgresql`` package: the bench starts
a throwaway cluster of its own (``tests/support/pg.py``).

Usage: ``python bench/failover_gap.py [--kills 10] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import pg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from controllers import TOKENS, _get, _wait
from latency import RC, free_port, summary

HOST = "gapbox"


def _polled(worker: int, ports: list[int]) -> int | None:
    """The index of the controller ``worker`` holds an established connection to, when it
    is exactly one (``/proc/net/tcp``: the sockets of its descriptors)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{worker}/fd"):
        try:
            target = os.readlink(f"/proc/{worker}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    with open(f"/proc/{worker}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            port = int(remote.rsplit(":", 1)[1], 16)
            if state == "01" and inode in inodes and port in ports:
                found.add(ports.index(port))
    return found.pop() if len(found) == 1 else None


class Pair:
    """Two controllers on ``database`` and the worker, stopped by PID on exit."""

    def __init__(self, tmp: Path, database: str) -> None:
        self.tmp, self.database = tmp, database
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.servers: list[subprocess.Popen[bytes] | None] = [None, None]
        self.worker: subprocess.Popen[bytes] | None = None
        self.stamps = tmp / "starts"

    def start(self, i: int) -> None:
        args = [
            RC,
            "serve",
            "--addr",
            f"127.0.0.1:{self.ports[i]}",
            "--data",
            str(self.tmp / f"d{i}"),
        ]
        self.servers[i] = subprocess.Popen(
            [*args, "--database", self.database],
            env=dict(os.environ, RC_TOKENS=TOKENS),
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / f"controller{i}.log", "ab"),  # noqa: SIM115
        )
        _wait(lambda: _get(self.urls[i], "/v1/state") is not None, f"controller {i}")

    def __enter__(self) -> Pair:
        self.start(0)
        self.start(1)
        cfg = self.tmp / "worker.yaml"
        cfg.write_text(
            f"controller_url: {','.join(self.urls)}\ntoken: wtok\nhost: {HOST}\n"
            f"state_dir: {self.tmp / 'state'}\ndevices: [slot0]\n"
        )
        self.worker = subprocess.Popen(
            [RC, "worker", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / "worker.log", "ab"),
        )
        _wait(lambda: len(_get(self.urls[0], "/v1/devices") or []) == 1, "the worker")
        return self

    def __exit__(self, *_: object) -> None:
        for p in [self.worker, *self.servers]:
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()

    def submit(self, i: int) -> str:
        import urllib.request

        script = f'echo "$RC_JOB_ID $(date +%s.%N)" >> {self.stamps}'
        body = json.dumps({"command": ["sh", "-c", script], "submitter": "bench"}).encode()
        req = urllib.request.Request(
            self.urls[i] + "/v1/jobs",
            data=body,
            method="POST",
            headers={"Authorization": "Bearer ctok", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return str(json.loads(r.read())["id"])

    def started_at(self, job_id: str) -> float | None:
        if not self.stamps.exists():
            return None
        for line in self.stamps.read_text().splitlines():
            jid, _, at = line.partition(" ")
            if jid == job_id:
                return float(at)
        return None

    def done(self, job_id: str, i: int) -> bool:
        view = _get(self.urls[i], f"/v1/jobs/{job_id}")
        return bool(view) and view["job"]["state"] in ("succeeded", "failed", "killed", "lost")

    def round(self, polled: bool) -> float:
        """One kill and the gap until the next job's process started."""
        worker = self.worker
        assert worker is not None
        _wait(lambda: _polled(worker.pid, self.ports) is not None, "a long poll")
        time.sleep(0.3)  # past the poll's own start
        at = _polled(worker.pid, self.ports)
        if at is None:
            return self.round(polled)
        target = at if polled else 1 - at
        victim = self.servers[target]
        assert victim is not None
        killed = time.time()
        victim.send_signal(signal.SIGKILL)
        survivor = 1 - target
        job = self.submit(survivor)
        _wait(lambda: self.started_at(job) is not None, "the job to start", 60)
        gap = self.started_at(job) - killed  # type: ignore[operator]
        _wait(lambda: self.done(job, survivor), "the job to end", 60)
        victim.wait(10)
        self.start(target)
        return gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    cluster = pg.start()
    results: dict[str, Any] = {"machine": machine}
    try:
        with (
            tempfile.TemporaryDirectory(prefix="rc-bench-") as root,
            Pair(Path(root), cluster.fresh_database()) as pair,
        ):
            gaps: dict[str, list[float]] = {"polled": [], "other": []}
            for _ in range(args.kills):
                for kind in ("polled", "other"):
                    gaps[kind].append(pair.round(kind == "polled"))
            for kind, samples in gaps.items():
                results[kind] = {**summary(samples), "samples": samples}
    finally:
        cluster.stop()
    print(f"machine: {machine}")
    for kind, what in (
        ("polled", "the controller the worker long-polls"),
        ("other", "the other controller (baseline)"),
    ):
        s = results[kind]
        print(
            f"SIGKILL {what} -> next job's process started: median {s['median']:.3f} s"
            f" (min {s['min']:.3f}, max {s['max']:.3f}, n={int(s['n'])})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
