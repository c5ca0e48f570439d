"""Where a handoff's time goes, timed from outside both processes.

A controller and a worker (``latency.Fleet``) with a loopback proxy between them
(``support.nemesis.FaultProxy`` in ``pass`` mode, its ``tap`` stamping every chunk it
reads with the wall clock). Job A runs ``sleep SECONDS; date +%s%N``; job B, queued
behind it on the same device, runs ``date +%s%N``. Per handoff, offsets from A's last
instruction:

* the worker's terminal report of A reaches the proxy (A's exit seen, the final log
  flush, the ``RC_JOB_ID`` sweep, the outbox write, the request);
* the controller's answer to it (the release, the scheduling pass, B's grant);
* B's assignment in the worker's waiting poll (the wake, the hand-out transaction);
* B's first instruction (the worker reads the answer, spawns, ``date`` starts).

The proxy adds its own hop (an asyncio read and write each way, ~0.1-0.3 ms) to every
request, so the whole is a little longer than ``bench/latency.py``'s handoff; the
phases are what this is for. ``python3 -c pass`` and ``flock true`` are timed in the
same run. Usage: ``python bench/handoff_phases.py [--repeats 20] [--seconds 0.3]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
from handoff import handoff_pair
from latency import HOST, Fleet, ms, summary, timed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.nemesis import FaultProxy

STEPS = ("report sent", "report answered", "assignment in the poll", "B's first instruction")


class Tape:
    """Every chunk the proxy forwarded: (connection, direction, wall ns, bytes)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, str, int, bytes]] = []
        self._lock = threading.Lock()

    def __call__(self, conn: int, direction: str, ns: int, chunk: bytes) -> None:
        with self._lock:
            self.chunks.append((conn, direction, ns, chunk))

    def snapshot(self) -> list[tuple[int, str, int, bytes]]:
        with self._lock:
            return list(self.chunks)


def _steps(chunks: list[tuple[int, str, int, bytes]], a: str, b: str) -> list[int]:
    """Wall ns of: A's terminal report, its answer, B's assignment (see the module doc)."""
    path = f"POST /v1/jobs/{a}/status".encode()
    report = next(
        (c for c in chunks if c[1] == "up" and c[3].startswith(path) and b'"succeeded"' in c[3]),
        None,
    )
    if report is None:
        raise SystemExit(f"no terminal report of {a} went through the proxy")
    answer = next(c for c in chunks if c[0] == report[0] and c[1] == "down" and c[2] > report[2])
    assigned = next(c for c in chunks if c[1] == "down" and b.encode() in c[3])
    return [report[2], answer[2], assigned[2]]


async def _handoff(client: httpx.AsyncClient, tape: Tape, seconds: float) -> list[float]:
    a, b, a_end, b_start = await handoff_pair(client, f"{HOST}:slot0", seconds)
    middle = _steps(tape.snapshot(), a, b)
    return [(t - a_end) / 1e6 for t in (*middle, b_start)]


async def _run(fleet: Fleet, tape: Tape, repeats: int, seconds: float) -> list[list[float]]:
    async with httpx.AsyncClient(
        base_url=fleet.url, headers={"Authorization": "Bearer ctok"}, timeout=60
    ) as client:
        await _handoff(client, tape, seconds)  # warm: first spawn, connections
        return [await _handoff(client, tape, seconds) for _ in range(repeats)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=0.3, help="how long job A runs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tape = Tape()
    with tempfile.TemporaryDirectory(prefix="rc-phases-") as tmp:
        fleet = Fleet(Path(tmp))
        with FaultProxy(fleet.port) as proxy:
            proxy.tap = tape
            fleet.worker_url = proxy.url
            with fleet:
                runs = asyncio.run(_run(fleet, tape, args.repeats, args.seconds))
                lock = Path(tmp) / "lock"
                flock = [timed(["flock", str(lock), "true"]) for _ in range(args.repeats)]
                py = [timed([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    result: dict[str, Any] = {
        step: summary([r[i] / 1e3 for r in runs]) for i, step in enumerate(STEPS)
    }
    result["python_pass"] = summary(py)
    result["flock_true"] = summary(flock)
    print(f"{len(runs)} handoffs, ms after A's last instruction (min/median/max):")
    for step in STEPS:
        print(f"  {step:<24} {ms(result[step])}")
    gaps = [[r[0], *(r[k] - r[k - 1] for k in range(1, len(STEPS)))] for r in runs]
    print(
        "  phase medians:",
        ", ".join(f"{s} +{statistics.median(g[i] for g in gaps):.2f}" for i, s in enumerate(STEPS)),
    )
    print(f"python3 -c pass          {ms(result['python_pass'])}")
    print(f"flock true               {ms(result['flock_true'])}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, **result}, indent=2))


if __name__ == "__main__":
    main()
