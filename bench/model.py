"""The store model test, long: ``tests/store/test_state_machine.py`` at 5,000 × 200 steps.

The same state machine CI runs at 100 × 50 (the real ``Store`` on a real SQLite file,
checked after every step against the model), run here in batches so a failure in one
batch does not end the others: each batch is one Hypothesis run of ``--batch`` examples
with its own seed, shrinks its first failure, and the figures count every batch. Runs
and steps are counted as executed (Hypothesis may end a run before its step budget),
not as asked for. The database goes under ``--tmp`` (default ``/dev/shm`` when it
exists) so the run measures the model, not the disk's fsync.

Usage: ``python bench/model.py [--examples 5000] [--steps 200] [--batch 100] [--seed N]
[--tmp DIR] [--json out.json] [--progress out.jsonl]``. The CI test reads the same
sizes from ``RC_MODEL_EXAMPLES`` / ``RC_MODEL_STEPS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from store.test_state_machine import StoreMachine


class Counts:
    """What the counting machine saw: runs started and steps checked, across batches."""

    runs = 0
    steps = 0


class CountingMachine(StoreMachine):
    """The model test unchanged, counting its runs and the steps after which it checked."""

    def __init__(self) -> None:
        super().__init__()
        Counts.runs += 1

    @invariant()
    def count_the_step(self) -> None:
        Counts.steps += 1


@dataclasses.dataclass
class Batch:
    """One Hypothesis run's figures."""

    index: int
    seed: int
    examples: int
    runs: int
    steps: int
    seconds: float
    failure: str = ""


def run_batch(index: int, batch_seed: int, examples: int, steps: int) -> Batch:
    """One Hypothesis run of ``examples`` examples of at most ``steps`` steps each."""
    runs0, steps0, t0 = Counts.runs, Counts.steps, time.monotonic()
    failure = ""
    try:
        seed(batch_seed)(run_state_machine_as_test)(
            CountingMachine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.generate, Phase.shrink],
                print_blob=True,
            ),
        )
    except Exception:  # a model failure: keep its shrunk report, go on with the next batch
        failure = traceback.format_exc(limit=-8)
    return Batch(
        index=index,
        seed=batch_seed,
        examples=examples,
        runs=Counts.runs - runs0,
        steps=Counts.steps - steps0,
        seconds=round(time.monotonic() - t0, 1),
        failure=failure,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=5000, help="runs in all")
    ap.add_argument("--steps", type=int, default=200, help="steps per run, at most")
    ap.add_argument("--batch", type=int, default=100, help="runs per Hypothesis run")
    ap.add_argument("--seed", type=int, default=None, help="first batch's seed")
    default_tmp = "/dev/shm" if Path("/dev/shm").is_dir() else None
    ap.add_argument("--tmp", default=default_tmp, help="where the databases go")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--progress", type=Path, help="append one JSON line per batch here")
    args = ap.parse_args()
    if args.examples < 1 or args.steps < 1 or args.batch < 1:
        ap.error("--examples, --steps and --batch must be at least 1")
    if args.tmp:
        os.environ["TMPDIR"] = args.tmp
        tempfile.tempdir = None  # read TMPDIR again
    first = args.seed if args.seed is not None else random.randrange(2**32)
    batches: list[Batch] = []
    t0 = time.monotonic()
    left, index = args.examples, 0
    while left > 0:
        n = min(args.batch, left)
        b = run_batch(index, first + index, n, args.steps)
        batches.append(b)
        left -= n
        index += 1
        line = {k: v for k, v in dataclasses.asdict(b).items() if k != "failure"}
        line["failed"] = bool(b.failure)
        print(json.dumps(line), flush=True)
        if args.progress:
            with args.progress.open("a") as f:
                f.write(json.dumps(dataclasses.asdict(b)) + "\n")
    failed = [b for b in batches if b.failure]
    figures = {
        "runs": sum(b.runs for b in batches),
        "steps": sum(b.steps for b in batches),
        "examples_asked": args.examples,
        "steps_per_run_max": args.steps,
        "batches": len(batches),
        "failed_batches": len(failed),
        "first_seed": first,
        "seconds": round(time.monotonic() - t0, 1),
    }
    for b in failed:
        print(f"--- batch {b.index} (seed {b.seed}) failed:\n{b.failure}", file=sys.stderr)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps({**figures, "failures": [b.failure for b in failed]}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
