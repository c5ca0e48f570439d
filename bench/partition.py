"""Partition trials: when a black-holed worker's device goes ``unknown`` and ``unhealthy``.

Each trial (``support.partition.trial``) starts a real ``rc serve`` and ``rc worker``
with a fault proxy between them, runs a job on the worker's device with a second job
queued for it, black-holes the proxy and samples the device every 0.1 s until it is
``unhealthy``, then heals and watches for a proof. Timings are the spec's (grace 30 s,
write-off 300 s, sweep 10 s, heartbeat 10 s) times ``--scale``; figures are reported
in seconds as measured and divided by the scale (what they would be at real timings).

Reports min/median/max of ``unknown`` and ``unhealthy`` after the worker's last
contact and after the partition's start, grants before proof (must be 0) and flock
exclusivity violations (must be 0). ``--jobs N`` runs N trials side by side (each has
its own controller, worker and proxy; at real timings a trial is about 6 minutes, mostly
waiting); ``--coarse S`` looks at the device only every S seconds outside the windows
around the expected verdicts (``support.partition.fine_windows``), so many trials at
once do not load the machine. Usage:
``python bench/partition.py [--trials 10] [--scale 1] [--jobs 1] [--stagger 0]
[--startups 2] [--sample 0.1] [--coarse S] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import partition


def spread(values: list[float], scale: float) -> dict[str, float]:
    if not values:
        return {}
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
        "min_real": round(min(values) / scale, 1),
        "median_real": round(statistics.median(values) / scale, 1),
        "max_real": round(max(values) / scale, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the spec's timings")
    ap.add_argument("--jobs", type=int, default=1, help="trials run side by side")
    ap.add_argument("--sample", type=float, default=0.1, help="seconds between looks")
    ap.add_argument("--coarse", type=float, help="seconds between looks outside the windows")
    ap.add_argument(
        "--stagger", type=float, default=0, help="seconds between the first --jobs starts"
    )
    ap.add_argument(
        "--startups", type=int, default=2, help="trials bringing their processes up at once"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.trials < 1 or args.jobs < 1 or not 0 < args.scale <= 1:
        ap.error("--trials and --jobs must be at least 1 and --scale in (0, 1]")
    if args.stagger < 0 or args.startups < 1:
        ap.error("--stagger must be >= 0 seconds and --startups at least 1")
    if args.sample <= 0 or (args.coarse is not None and args.coarse < args.sample):
        ap.error("--sample must be > 0 and --coarse at least --sample")
    results: list[partition.TrialResult] = []
    errors: list[str] = []
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="rc-partition-") as tmp,
        ThreadPoolExecutor(max_workers=args.jobs) as pool,
    ):
        startup = threading.Semaphore(args.startups)

        def one(i: int) -> partition.TrialResult:
            # Spread the first wave so the trials' verdict windows (fine sampling) and
            # start-ups do not all fall at once; later trials start as slots free up.
            time.sleep(args.stagger * i if i < args.jobs else 0)
            return partition.trial(
                Path(tmp) / f"t{i}",
                scale=args.scale,
                sample=args.sample,
                heal_wait=3,
                coarse=args.coarse,
                startup=startup,
            )

        runs = {pool.submit(one, i): i for i in range(args.trials)}
        for fut in as_completed(runs):
            try:
                r = fut.result()
            except Exception as exc:  # one trial's harness failure must not end the run
                errors.append(f"trial {runs[fut]}: {exc!r}")
                print(runs[fut], "error", repr(exc), flush=True)
                continue
            results.append(r)
            print(runs[fut], json.dumps(dataclasses.asdict(r)), flush=True)
            if args.json:  # as trials end, so a long run interrupted still says something
                args.json.write_text(json.dumps([dataclasses.asdict(x) for x in results]))

    def got(name: str) -> list[float]:
        return [v for r in results if (v := getattr(r, name)) is not None]

    report = {
        "trials": len(results),
        "scale": args.scale,
        "jobs": args.jobs,
        "unknown_after_last_contact": spread(got("unknown_after"), args.scale),
        "unhealthy_after_last_contact": spread(got("unhealthy_after"), args.scale),
        "unknown_after_partition": spread(got("unknown_after_partition"), args.scale),
        "unhealthy_after_partition": spread(got("unhealthy_after_partition"), args.scale),
        "never_unknown": sum(r.unknown_after is None for r in results),
        "never_unhealthy": sum(r.unhealthy_after is None for r in results),
        "grants_before_proof": sum(r.grants_before_proof for r in results),
        "exclusivity_violations": sum(r.exclusivity_violations for r in results),
        "reasons": sorted({r.reason for r in results}),
        "job_a_final_states": sorted({r.a_final for r in results}),
        "recovered_after_heal": sum(r.recovered for r in results),
        "trial_errors": errors,
        "seconds": round(time.monotonic() - t0),
        "trials_detail": [dataclasses.asdict(r) for r in results],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "trials_detail"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
