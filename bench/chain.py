"""A chain of dependent jobs end to end: each waits for the one before (``after``,
EXT-SHARE-2) and starts when it ends, with no timer in between (EXT-FAST).

A real ``rc serve`` and ``rc worker`` on loopback (``latency.Fleet``). The first job
waits for a gate file; the other ``--jobs - 1`` are submitted over the API meanwhile,
each naming the one before it. Every job appends ``date +%s%N`` to one file, so once
the gate opens the file holds one wall-clock stamp per job, in order. Each gap is a
job's stamp minus its predecessor's: the predecessor's exit, its terminal report, the
pass that settles the dependency and places the next job, the worker's poll and the
spawn of ``sh`` and ``date``. The target is every gap at most 20 ms.

The same chain is then run as a plain queue: the jobs pinned to one device, no
``after``, so each gap is an ordinary handoff (EXT-FAST-3) on the same machine at the
same moment: what the dependencies add is the difference.

Usage: ``python bench/chain.py [--jobs 1000] [--json out.json]``. Run
``.venv/bin/python -m compileall -q src`` first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from latency import HOST, Fleet, summary, timed

ENDS = ("succeeded", "failed", "killed", "lost")
TARGET = 0.020  #: seconds from a job's end to the next one's start


def chain(fleet: Fleet, tmp: Path, n: int, dependent: bool = True) -> list[float]:
    """Run a chain of ``n`` jobs, each waiting for the one before (``dependent``) or
    queued behind it on one device; the gaps between consecutive stamps, in seconds."""
    name = "after" if dependent else "queue"
    gate, stamps = tmp / f"gate-{name}", tmp / f"stamps-{name}"
    where = {} if dependent else {"device_id": f"{HOST}:slot0"}
    first = f"while [ ! -e {gate} ]; do sleep 0.01; done; date +%s%N >> {stamps}"
    step = f"date +%s%N >> {stamps}"
    headers = {"Authorization": "Bearer ctok"}
    with httpx.Client(base_url=fleet.url, headers=headers, timeout=30) as client:
        prev = submit(client, first, [], where)
        started = time.monotonic()
        for _ in range(n - 1):
            prev = submit(client, step, [prev] if dependent else [], where)
        print(f"{name}: submitted {n} jobs in {time.monotonic() - started:.1f} s", flush=True)
        gate.touch()
        deadline = time.monotonic() + max(120.0, n * 0.5)
        while True:
            job = client.get(f"/v1/jobs/{prev}").json()["job"]
            if job["state"] in ENDS:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the chain did not end in time; see {tmp}")
            time.sleep(0.2)
        if job["state"] != "succeeded":
            raise SystemExit(f"the last job ended {job['state']}: {job}")
    ns = [int(line) for line in stamps.read_text().split()]
    if len(ns) != n:
        raise SystemExit(f"{len(ns)} stamps for {n} jobs; see {tmp}")
    return [(b - a) / 1e9 for a, b in itertools.pairwise(ns)]


def submit(client: httpx.Client, script: str, after: list[str], where: dict[str, str]) -> str:
    body: dict[str, Any] = {"command": ["sh", "-c", script], "submitter": "bench", **where}
    if after:
        body["after"] = after
    r = client.post("/v1/jobs", json=body)
    if r.status_code != 201:
        raise SystemExit(f"submit refused: {r.status_code} {r.text}")
    return str(r.json()["id"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.jobs < 2:
        raise SystemExit("--jobs must be at least 2")
    baseline = summary([timed([sys.executable, "-c", "pass"]) for _ in range(5)])
    tmp = Path(tempfile.mkdtemp(prefix="rc-chain-"))
    out: dict[str, Any] = {"python_pass": baseline}
    with Fleet(tmp) as fleet:
        for name, dependent in (("after", True), ("queue", False)):
            gaps = chain(fleet, tmp, args.jobs, dependent)
            s = summary(gaps)
            over = sum(g > TARGET for g in gaps)
            out[name] = {"gaps": s, "over_target": over}
            what = "each after the one before" if dependent else "queued on one device"
            print(
                f"{name} ({what}), end to start over {len(gaps)} handoffs: min"
                f" {s['min'] * 1e3:.1f} ms, median {s['median'] * 1e3:.1f} ms, max"
                f" {s['max'] * 1e3:.1f} ms; over 20 ms: {over}",
                flush=True,
            )
    print(f"python3 -c pass: median {baseline['median'] * 1e3:.1f} ms", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
