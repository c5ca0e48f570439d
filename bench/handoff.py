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

``--jobs N`` adds the worker's own cost: its resident memory at rest and after ``N``
``true`` jobs submitted over the API on four devices, and its CPU time per job (user +
system from ``/proc/<pid>/stat`` across the run, threads included), the controller's
beside it.

Usage: ``python bench/handoff.py [--poll-wait 1s --poll-wait 30s] [--seconds 1]
[--repeats 10] [--jobs 1000] [--worker-src DIR] [--json out.json]``.
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


async def handoff_pair(
    client: httpx.AsyncClient, device: str, seconds: float
) -> tuple[str, str, int, int]:
    """Job A (``sleep SECONDS`` then ``date``) and job B (``date``) queued behind it on
    ``device``, both awaited: their IDs, A's last stamp and B's first (wall ns)."""
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
    return a["id"], b["id"], stamps[0], stamps[1]


async def _handoff(client: httpx.AsyncClient, device: str, seconds: float) -> float:
    _, _, a_end, b_start = await handoff_pair(client, device, seconds)
    return (b_start - a_end) / 1e9


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its threads so far (not its reaped children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _many(client: httpx.AsyncClient, n: int) -> None:
    """``n`` ``true`` jobs on any device, at most 16 in flight, each awaited to its end."""
    sem = asyncio.Semaphore(16)

    async def one() -> None:
        async with sem:
            job = (
                await client.post("/v1/jobs", json={"command": ["true"], "submitter": "bench"})
            ).json()
            while job["state"] not in ENDS:
                await asyncio.sleep(0.05)  # sparse: the bench must not load the controller
                job = (await client.get(f"/v1/jobs/{job['id']}")).json()["job"]
            if job["state"] != "succeeded":
                raise SystemExit(f"job {job['id']} ended {job['state']}: {job}")

    await asyncio.gather(*(one() for _ in range(n)))


async def _cost(fleet: Fleet, n: int) -> dict[str, Any]:
    worker, controller = fleet.procs[1].pid, fleet.procs[0].pid
    async with httpx.AsyncClient(
        base_url=fleet.url, headers={"Authorization": "Bearer ctok"}, timeout=120
    ) as c:
        await _many(c, 8)  # warm-up: first spawn, first report, connections
        await asyncio.sleep(1.0)
        rest = _rss_mib(worker), _rss_mib(controller)
        cpu0 = _cpu_seconds(worker), _cpu_seconds(controller)
        t0 = time.perf_counter()
        await _many(c, n)
        took = time.perf_counter() - t0
        cpu1 = _cpu_seconds(worker), _cpu_seconds(controller)
        await asyncio.sleep(1.0)
        after = _rss_mib(worker), _rss_mib(controller)
    return {
        "jobs": n,
        "jobs_per_s": n / took,
        "worker_cpu_ms_per_job": (cpu1[0] - cpu0[0]) / n * 1e3,
        "controller_cpu_ms_per_job": (cpu1[1] - cpu0[1]) / n * 1e3,
        "worker_rss_mib": [rest[0], after[0]],
        "controller_rss_mib": [rest[1], after[1]],
    }


def bench_cost(n: int, worker_src: str) -> dict[str, Any]:
    env = None
    if worker_src:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(worker_src))
    with (
        tempfile.TemporaryDirectory(prefix="rc-bench-cost-") as tmp,
        Fleet(Path(tmp), worker_env=env) as fleet,
    ):
        time.sleep(1.0)
        return asyncio.run(_cost(fleet, n))


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
    ap.add_argument(
        "--jobs", type=int, default=0, help="also measure the worker's cost over N jobs"
    )
    ap.add_argument("--worker-src", default="", help="run the worker from this src tree")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    waits = args.poll_wait or ["1s", "30s"]
    started = time.strftime("%Y-%m-%d %H:%M")
    py = [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    rows = [bench(w, args.seconds, args.repeats, args.worker_src) for w in waits]
    cost = bench_cost(args.jobs, args.worker_src) if args.jobs else None
    py += [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    machine = f"{platform.machine()} {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}"
    print(f"machine: {machine}; {started}; worker from {args.worker_src or 'this tree'}")
    for row in rows:
        print(f"handoff after a {args.seconds:g} s job, poll_wait {row['poll_wait']:>4}: {ms(row)}")
    if cost is not None:
        w, k = cost["worker_rss_mib"], cost["controller_rss_mib"]
        print(
            f"{cost['jobs']} true jobs over the API at {cost['jobs_per_s']:.1f} jobs/s: "
            f"worker CPU {cost['worker_cpu_ms_per_job']:.2f} ms/job, "
            f"controller CPU {cost['controller_cpu_ms_per_job']:.2f} ms/job"
        )
        print(
            f"resident memory at rest -> after: worker {w[0]:.1f} -> {w[1]:.1f} MiB, "
            f"controller {k[0]:.1f} -> {k[1]:.1f} MiB"
        )
    print(f"python3 -c pass                          {ms(summary(py))}")
    if args.json:
        out = {"machine": machine, "rows": rows, "cost": cost, "python_pass": summary(py)}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
