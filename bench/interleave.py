"""Long runs of the interleaving harness (``tests/support/interleave.py``): several
stores on one database driven step by step in orders hypothesis chooses, the invariants
checked against the database after every step.

    .venv/bin/python bench/interleave.py --examples 2000 --stores 2 --backend postgresql

Prints what the runs did (steps, grants, faults by crash point, steps run together and
how many of them blocked) and every breach found (there must be none). PostgreSQL runs
start a throwaway cluster (Debian's ``postgresql``), as the tests do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from support import interleave, pg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--stores", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40, help="most steps in one example")
    ap.add_argument("--backend", choices=("sqlite", "postgresql"), default="postgresql")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shrink", action="store_true", help="shrink a failing example (slow)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    cluster = pg.start() if args.backend == "postgresql" else None
    scratch = tempfile.TemporaryDirectory()
    total = interleave.Tally()
    found: list[list[str]] = []
    examples = 0
    try:
        if cluster is not None:
            from resource_controller.clock import FakeClock
            from resource_controller.store.facade import Store

            Store(cluster.url(pg.TEMPLATE), FakeClock()).close()

        @settings(
            max_examples=args.examples,
            deadline=None,
            database=None,
            derandomize=False,
            phases=list(Phase) if args.shrink else [Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(plan=st.lists(interleave.steps(), min_size=args.steps // 2, max_size=args.steps))
        def one(plan: list[interleave.Step]) -> None:
            nonlocal examples
            examples += 1
            where = (
                cluster.fresh_database() if cluster else interleave.fresh_sqlite(Path(scratch.name))
            )
            bad, tally = interleave.run(where, plan, args.stores)
            total.add(tally)
            if bad:
                found.append(bad)
                raise AssertionError("\n".join(bad))

        started = time.monotonic()
        with contextlib.suppress(AssertionError):  # reported below, shrunk by hypothesis
            one()
        took = time.monotonic() - started
    finally:
        if cluster is not None:
            cluster.stop()
        scratch.cleanup()
    figures = {
        "backend": args.backend,
        "stores": args.stores,
        "examples": examples,
        "steps": total.steps,
        "grants": total.grants,
        "together": total.together,
        "together_blocked": total.blocked,
        "faults": dict(sorted(total.faults.items())),
        "refused": dict(sorted(total.refused.items())),
        "acknowledged": total.acknowledged,
        "breaches": len(found),
        "seconds": round(took, 1),
    }
    print(json.dumps(figures, indent=2))
    for bad in found[-1:]:
        print("\n".join(bad))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
