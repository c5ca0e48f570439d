"""Crash consistency, long: ``rc serve`` killed at every write path many times.

For each crash point (``resource_controller.crashpoints.POINTS``) and each of
``--crashes`` trials, ``support.crashrun.trial`` starts a real ``rc serve`` armed to
``os._exit`` at that point's ``n``-th hit (``n`` cycling 1..``--max-n``, so crashes land
after different amounts of acknowledged history), drives a worker and a client until
it dies, checks ``PRAGMA integrity_check``, restarts on the same data directory and
checks every acknowledged change, the store's cross-table consistency, the in-flight
submit and one more round on the restarted controller.

Reports per point: crashes, integrity failures, acknowledged changes checked and lost,
inconsistencies and any other problem. Usage:
``python bench/crash.py [--crashes 50] [--max-n 3] [--jobs 1] [--point NAME ...]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import crashrun


@dataclasses.dataclass
class PointFigures:
    """One crash point's totals over its trials."""

    crashes: int = 0
    integrity_failures: int = 0
    acked_changes_checked: int = 0
    acked_changes_lost: int = 0
    inconsistencies: int = 0
    other_problems: list[str] = dataclasses.field(default_factory=list)
    #: Trials that could not be judged (e.g. a start-up timed out on a loaded machine).
    harness_errors: list[str] = dataclasses.field(default_factory=list)

    def add(self, out: crashrun.Outcome, label: str) -> None:
        self.crashes += out.crashed
        self.integrity_failures += out.integrity != "ok"
        self.acked_changes_checked += out.acked_changes
        self.acked_changes_lost += len(out.lost)
        self.inconsistencies += len(out.inconsistent)
        others = [p for p in out.problems if p not in out.lost + out.inconsistent]
        if others:
            self.other_problems.append(f"{label}: {others}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crashes", type=int, default=50, help="trials per crash point")
    ap.add_argument("--max-n", type=int, default=3, help="crash at hit 1..N, cycling")
    ap.add_argument("--point", action="append", help="only these points (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="trials run side by side")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if min(args.crashes, args.max_n, args.jobs) < 1:
        ap.error("--crashes, --max-n and --jobs must be at least 1")
    points = args.point or list(crashrun.every_point())
    unknown = sorted(set(points) - set(crashrun.every_point()))
    if unknown:
        ap.error(f"unknown crash point(s): {', '.join(unknown)}")
    results: dict[str, PointFigures] = {p: PointFigures() for p in points}
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="rc-crash-") as tmp,
        ThreadPoolExecutor(max_workers=args.jobs) as pool,
    ):
        for point in points:
            row = results[point]
            runs = {
                pool.submit(
                    crashrun.trial, point, 1 + i % args.max_n, Path(tmp) / f"{point}-{i}", f"c{i}"
                ): f"{point}:{1 + i % args.max_n} #{i}"
                for i in range(args.crashes)
            }
            for fut, label in runs.items():
                try:
                    row.add(fut.result(), label)
                except Exception as exc:  # the harness failed, not the controller: say so
                    row.harness_errors.append(f"{label}: {exc!r}")
            print(point, json.dumps(dataclasses.asdict(row)), flush=True)
            if args.json:  # after every point, so a long run interrupted still says something
                args.json.write_text(
                    json.dumps({p: dataclasses.asdict(r) for p, r in results.items()}, indent=2)
                )
    total = {
        name: sum(getattr(r, name) for r in results.values())
        for name in ("crashes", "integrity_failures", "acked_changes_checked", "acked_changes_lost")
    }
    total["inconsistencies"] = sum(r.inconsistencies for r in results.values())
    report = {
        "points": {p: dataclasses.asdict(r) for p, r in results.items()},
        "total": total,
        "seconds": round(time.monotonic() - t0),
    }
    print(json.dumps(total, indent=2), f"in {report['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
