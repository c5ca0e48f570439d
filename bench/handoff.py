"""Handoff of one device from a job to the one queued behind it, per ``poll_wait``.

Job A runs ``sleep SECONDS`` and then prints the time; job B, queued behind it on the
same device, prints the time as its first instruction. The figure is B's instant minus
A's: A's exit to B's start, through A's terminal report, the scheduling pass, B's
hand-out to the worker's poll and the spawn. Each ``--poll-wait`` gets its own fresh
controller and worker (``rc serve``, ``rc worker`` on loopback), and ``python3 -c
pass`` is timed in the same run as a baseline for how busy the machine is.

EXT-FAST-4 is what this watches: with a short ``poll_wait`` and a job as long as the
wait, the worker's idle poll ends just as the device frees. ``--worker-src DIR`` runs
the worker from another source tree (``git archive <commit> src | tar -x -C /tmp/x``,
then ``--worker-src /tmp/x/src``) to compare with an earlier commit.

Usage: ``python bench/handoff.py [--poll-wait 1s --poll-wait 30s] [--seconds 1]
[--repeats 10] [--worker-src DIR] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from latency import HOST, Fleet, ms, summary, timed

ENDS = ("succeeded", "failed", "killed", "lost")


async def _handoff(client: httpx.AsyncClient, device: str, seconds: float) -> float:
    body = {"device_id": device, "submitter": "bench"}
    command = ["sh", "-c", f"sleep {seconds}; date +%s%N"]
    a = (await client.post("/v1/jobs", json={**body, "command": command})).json()
    b = (await client.post("/v1/jobs", json={**body, "command": ["date", "+%s%N"]})).json()
    stamps = []
    for job in (a, b):
        while job["state"] not in ENDS:
            await asyncio.sleep(0.02)
            job = (await client.get(f"/v1/jobs/{job['id']}")).json()["job"]
        if job["state"] != "succeeded":
            raise SystemExit(f"job {job['id']} ended {job['state']}: {job}")
        out = (await client.get(f"/v1/jobs/{job['id']}/logs?follow=false")).text
        stamps.append(int(out.split()[-1]))
    return (stamps[1] - stamps[0]) / 1e9


async def _measure(fleet: Fleet, seconds: float, repeats: int) -> list[float]:
    async with httpx.AsyncClient(
        base_url=fleet.url, headers={"Authorization": "Bearer ctok"}, timeout=120
    ) as c:
        await _handoff(c, f"{HOST}:slot0", 0.05)  # warm-up, not counted
        return [await _handoff(c, f"{HOST}:slot0", seconds) for _ in range(repeats)]


def bench(poll_wait: str, seconds: float, repeats: int, worker_src: str) -> dict[str, Any]:
    env = None
    if worker_src:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(worker_src))
    with (
        tempfile.TemporaryDirectory(prefix="rc-bench-handoff-") as tmp,
        Fleet(Path(tmp), worker_extra=f"poll_wait: {poll_wait}\n", worker_env=env) as fleet,
    ):
        return {"poll_wait": poll_wait, **summary(asyncio.run(_measure(fleet, seconds, repeats)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--poll-wait", action="append", help="worker poll_wait (repeatable)")
    ap.add_argument("--seconds", type=float, default=1.0, help="how long job A runs")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--worker-src", default="", help="run the worker from this src tree")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    waits = args.poll_wait or ["1s", "30s"]
    started = time.strftime("%Y-%m-%d %H:%M")
    py = [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    rows = [bench(w, args.seconds, args.repeats, args.worker_src) for w in waits]
    py += [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    machine = f"{platform.machine()} {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}"
    print(f"machine: {machine}; {started}; worker from {args.worker_src or 'this tree'}")
    for row in rows:
        print(f"handoff after a {args.seconds:g} s job, poll_wait {row['poll_wait']:>4}: {ms(row)}")
    print(f"python3 -c pass                          {ms(summary(py))}")
    if args.json:
        out = {"machine": machine, "rows": rows, "python_pass": summary(py)}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
