"""Chaos: exclusivity and outcomes while the controller and workers are killed.

Phase 1 (``--seconds``, default 120): a controller and 4 workers with 2 devices each;
16 concurrent clients submit trivial jobs that take ``flock -n`` on a per-device file
(exit 99 if it is already held: two jobs on one device). Meanwhile the controller is
``kill -9``'d and restarted every 20 s and a random worker every 30 s. Clients retry
submits with the same idempotency key, so an outage never duplicates a job. After the
load stops, the fleet is given time to drain.

Phase 2 (EXT-OUTBOX-4): 50 jobs running on 4 workers, the controller down for 60 s
while they finish; every outcome must land with its real exit code and no device may
be quarantined.

Each job stamps its hold of the device through ``support.history.FlockRecorder`` and
the run is judged by ``support.history.check`` (overlapping holds, lock refusals, jobs
without exactly one terminal state, duplicate jobs per idempotency key); processes are
killed through ``support.nemesis``.

Reports: jobs submitted, jobs per final state, exclusivity violations, exit-code
mismatches, jobs with no terminal state at the end, duplicate jobs, quarantined devices
and reasons.
Usage: ``python bench/chaos.py [--seconds 120] [--outage 60] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import history as hist
from support.nemesis import kill_hard

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
TERMINAL = hist.TERMINAL
HEADERS = {"Authorization": "Bearer ctok"}


class Fleet:
    """A controller and N workers, each restartable, all stopped by PID at the end."""

    def __init__(self, tmp: Path, workers: int, devices: int) -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.controller: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes] | None] = {
            f"chaos{i}": None for i in range(workers)
        }
        self.devices = devices

    def start_controller(self) -> None:
        env = dict(os.environ, RC_TOKENS="wtok:worker,ctok:client,atok:admin")
        self.controller = subprocess.Popen(
            [RC, "serve", "--addr", f"127.0.0.1:{self.port}", "--data", str(self.tmp / "data")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / "controller.log", "ab"),  # noqa: SIM115
        )
        _wait(lambda: _get(self.url, "/v1/state") is not None, 20, "controller")

    def kill_controller(self) -> None:
        if self.controller is not None:
            kill_hard(self.controller.pid)
            self.controller.wait(10)

    def start_worker(self, host: str) -> None:
        cfg = self.tmp / f"{host}.yaml"
        names = ", ".join(f"gpu{i}" for i in range(self.devices))
        cfg.write_text(
            f"controller_url: {self.url}\ntoken: wtok\nhost: {host}\n"
            f"state_dir: {self.tmp / ('state-' + host)}\ndevices: [{names}]\n"
        )
        self.workers[host] = subprocess.Popen(
            [RC, "worker", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / f"{host}.log", "ab"),  # noqa: SIM115
        )

    def kill_worker(self, host: str) -> None:
        proc = self.workers[host]
        if proc is not None:
            kill_hard(proc.pid)
            proc.wait(10)

    def stop(self) -> None:
        for proc in [*self.workers.values(), self.controller]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.workers.values(), self.controller]:
            if proc is not None:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, path: str) -> Any:
    try:
        r = httpx.get(url + path, headers=HEADERS, timeout=5)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def _wait(ok: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise SystemExit(f"{what} did not come up")


async def _submit(
    client: httpx.AsyncClient, body: dict[str, object], stop_at: float
) -> tuple[str, str] | None:
    """Submit with an idempotency key, retrying through outages; (key, job ID), or None
    if time ran out."""
    key = str(uuid.uuid4())
    body = {**body, "idempotency_key": key}
    while time.monotonic() < stop_at:
        try:
            r = await client.post("/v1/jobs", json=body)
            if r.status_code == 201:
                return key, str(r.json()["id"])
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    return None


async def _final(
    client: httpx.AsyncClient, job_id: str, stop_at: float
) -> dict[str, object] | None:
    while time.monotonic() < stop_at:
        try:
            r = await client.get(f"/v1/jobs/{job_id}")
            if r.status_code == 200 and r.json()["job"]["state"] in TERMINAL:
                job: dict[str, object] = r.json()["job"]
                return job
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.3)
    return None


async def phase_one(fleet: Fleet, seconds: float, drain: float) -> dict[str, object]:
    rec = hist.FlockRecorder(fleet.tmp / "locks")
    history = hist.History()
    expected: dict[str, int] = {}
    load_until = time.monotonic() + seconds
    rng = random.Random(7)

    async def client_loop(k: int) -> None:
        async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
            while time.monotonic() < load_until:
                code = rng.randrange(0, 6)
                command = rec.command('sleep "0.$(( $$ % 5 ))"', exit_code=code)
                got = await _submit(c, {"command": command, "submitter": f"chaos-{k}"}, load_until)
                if got is None:
                    return
                history.submitted.append(hist.Submission(*got))
                expected[got[1]] = code
                await _final(c, got[1], load_until)

    async def chaos_monkey() -> None:
        start = time.monotonic()
        next_ctl, next_wrk = start + 20, start + 30
        while time.monotonic() < load_until:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if now >= next_ctl:
                fleet.kill_controller()
                await asyncio.sleep(1)
                await asyncio.to_thread(fleet.start_controller)
                next_ctl = now + 20
            if now >= next_wrk:
                host = rng.choice(list(fleet.workers))
                fleet.kill_worker(host)
                await asyncio.sleep(1)
                fleet.start_worker(host)
                next_wrk = now + 30

    await asyncio.gather(chaos_monkey(), *(client_loop(k) for k in range(16)))
    finals: dict[str, dict[str, object] | None] = {}
    async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
        drain_until = time.monotonic() + drain
        for sub in history.submitted:
            finals[sub.job_id] = await _final(c, sub.job_id, drain_until)
    hist.add_controller_jobs(history, [f for f in finals.values() if f], at=time.time())
    history.intervals += rec.read()[0]
    history.refusals += rec.read()[1]
    verdict = hist.check(history, leases=True)
    states = collections.Counter(
        (f or {}).get("state", "no terminal state") for f in finals.values()
    )
    mismatched = sum(
        1
        for job_id, f in finals.items()
        if f
        and f["state"] in ("succeeded", "failed")
        and f.get("exit_code") not in (expected[job_id], hist.REFUSED_EXIT)
    )
    figures = verdict.figures()
    return {
        "submitted": len(history.submitted),
        "states": dict(states),
        "violations": figures["exclusivity_violations"],
        "exit_code_mismatches": mismatched,
        "without_terminal_state": figures["without_terminal_state"],
        "duplicate_jobs": figures["duplicate_jobs"],
        "checker": figures,
        "quarantined": _quarantined(fleet),
    }


def _quarantined(fleet: Fleet) -> dict[str, str]:
    views = _get(fleet.url, "/v1/devices") or []
    return {
        v["device"]["id"]: v.get("quarantine_reason", "")
        for v in views
        if v["device"]["state"] == "unhealthy"
    }


async def phase_two(fleet: Fleet, outage: float, jobs: int = 50) -> dict[str, object]:
    rng = random.Random(11)
    expected: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
        for i in range(jobs):
            code = rng.randrange(0, 6)
            sleep = rng.uniform(3, outage - 10)
            r = await c.post(
                "/v1/jobs",
                json={
                    "command": ["sh", "-c", f"sleep {sleep:.1f}; exit {code}"],
                    "submitter": "outage",
                    "device_id": f"chaos{i % 4}:gpu{i // 4}",
                },
            )
            expected[r.json()["id"]] = code
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = await c.get("/v1/jobs?state=running&limit=200")
            if len(r.json()["jobs"]) == jobs:
                break
            await asyncio.sleep(0.2)
    fleet.kill_controller()
    await asyncio.sleep(outage)
    await asyncio.to_thread(fleet.start_controller)
    async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
        until = time.monotonic() + 120
        finals = {j: await _final(c, j, until) for j in expected}
    await asyncio.sleep(35)  # past the restarted controller's hold-off: sweeps now judge
    recorded = sum(
        1
        for j, f in finals.items()
        if f and f["state"] in ("succeeded", "failed") and f.get("exit_code") == expected[j]
    )
    return {
        "jobs": jobs,
        "recorded_with_real_exit_code": recorded,
        "quarantined": _quarantined(fleet),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--outage", type=float, default=60)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="rc-chaos-") as tmp:
        fleet = Fleet(Path(tmp) / "one", workers=4, devices=2)
        fleet.tmp.mkdir()
        try:
            fleet.start_controller()
            for host in fleet.workers:
                fleet.start_worker(host)
            _wait(lambda: len(_get(fleet.url, "/v1/devices") or []) == 8, 30, "workers")
            results["chaos"] = asyncio.run(phase_one(fleet, args.seconds, drain=90))
        finally:
            fleet.stop()
        fleet = Fleet(Path(tmp) / "two", workers=4, devices=13)
        fleet.tmp.mkdir()
        try:
            fleet.start_controller()
            for host in fleet.workers:
                fleet.start_worker(host)
            _wait(lambda: len(_get(fleet.url, "/v1/devices") or []) == 52, 30, "workers")
            results["outage"] = asyncio.run(phase_two(fleet, args.outage))
        finally:
            fleet.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
