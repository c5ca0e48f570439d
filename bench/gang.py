"""How long a two-device job waits behind a steady stream of one-device jobs (EXT-GANG-3).

One host with four devices (``rc serve`` and one ``rc worker`` on loopback). A feeder
submits one-device jobs (``sleep --job-seconds``) at ``--rate`` per second, faster than
four devices drain them, so the queue only grows. Once all four devices are busy and
jobs wait, a job asking for two devices is submitted; the figures are the time from
its submit until it leaves the queue, and the scheduling passes run meanwhile: the
controller loop's passes (``rc_scheduling_pass_seconds_count`` in ``/metrics``, each a
release or another kick) plus one inline pass per submit that landed in between
(every submit runs a pass, API-042). Without the head-of-queue claim the stream would
take each device as it frees and the two-device job would wait for ever; with it, the
wait is the time until two of the four running jobs end. ``python3 -c pass`` is timed
in the same run as a baseline for how busy the machine is.

Usage: ``python bench/gang.py [--repeats 10] [--job-seconds 0.5] [--rate 12]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from latency import Fleet, ms, summary, timed

PASSES = re.compile(r"^rc_scheduling_pass_seconds_count (\S+)$", re.M)


async def _loop_passes(client: httpx.AsyncClient) -> float:
    m = PASSES.search((await client.get("/metrics")).text)
    if m is None:
        raise SystemExit("no rc_scheduling_pass_seconds_count in /metrics")
    return float(m.group(1))


async def _state(client: httpx.AsyncClient) -> dict[str, Any]:
    data: dict[str, Any] = (await client.get("/v1/state")).json()
    return data


async def _feed(
    client: httpx.AsyncClient, seconds: float, rate: float, stop: asyncio.Event, sent: list[float]
) -> None:
    body = {"command": ["sleep", str(seconds)], "submitter": "stream"}
    while not stop.is_set():
        r = await client.post("/v1/jobs", json=body)
        if r.status_code != 201:
            raise SystemExit(f"stream submit refused: {r.status_code} {r.text}")
        sent.append(time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1 / rate)


async def _settle(client: httpx.AsyncClient) -> None:
    """Cancel what the stream left queued and wait for the running jobs to end."""
    for job in (await _state(client)).get("queued") or []:
        await client.post(f"/v1/jobs/{job['id']}/kill", json={"submitter": "stream"})
    while (await _state(client)).get("jobs"):
        await asyncio.sleep(0.05)


async def _one(client: httpx.AsyncClient, seconds: float, rate: float) -> tuple[float, float]:
    stop = asyncio.Event()
    sent: list[float] = []
    feeder = asyncio.create_task(_feed(client, seconds, rate, stop, sent))
    try:
        while True:  # four devices busy and a queue behind them
            st = await _state(client)
            if len(st.get("jobs") or []) == 4 and len(st.get("queued") or []) >= 4:
                break
            await asyncio.sleep(0.01)
        before = await _loop_passes(client)
        t0 = time.monotonic()
        gang = (
            await client.post(
                "/v1/jobs", json={"command": ["true"], "submitter": "gang", "count": 2}
            )
        ).json()
        job = gang
        while job["state"] == "queued":
            await asyncio.sleep(0.005)
            job = (await client.get(f"/v1/jobs/{gang['id']}")).json()["job"]
        t1 = time.monotonic()
        loop = await _loop_passes(client) - before
        inline = 1 + sum(1 for at in sent if t0 < at <= t1)  # the gang's own submit too
    finally:
        stop.set()
        await feeder
    if len(job.get("device_ids") or []) != 2:
        raise SystemExit(f"the two-device job got {job.get('device_ids')}")
    await _settle(client)
    return t1 - t0, loop + inline


async def _measure(fleet: Fleet, seconds: float, rate: float, repeats: int) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=fleet.url, headers={"Authorization": "Bearer ctok"}, timeout=120
    ) as c:
        waits, passes = [], []
        for _ in range(repeats):
            w, p = await _one(c, seconds, rate)
            waits.append(w)
            passes.append(p)
    return {"seconds": summary(waits), "passes": summary(passes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--job-seconds", type=float, default=0.5, help="each one-device job")
    ap.add_argument("--rate", type=float, default=12.0, help="stream submits per second")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M")
    py = [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    with tempfile.TemporaryDirectory(prefix="rc-bench-gang-") as tmp, Fleet(Path(tmp)) as fleet:
        got = asyncio.run(_measure(fleet, args.job_seconds, args.rate, args.repeats))
    py += [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    machine = (
        f"{platform.machine()} {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    s, p = got["seconds"], got["passes"]
    print(f"machine: {machine}; {started}; {args.repeats} repeats")
    print(f"stream: one-device jobs of {args.job_seconds:g} s at {args.rate:g}/s on 4 devices")
    print(f"2-device job, submit -> placed:  {ms(s)}")
    print(f"scheduling passes meanwhile:     {p['median']:.0f} ({p['min']:.0f}-{p['max']:.0f})")
    print(f"python3 -c pass                  {ms(summary(py))}")
    if args.json:
        out = {"machine": machine, **got, "python_pass": summary(py)}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
