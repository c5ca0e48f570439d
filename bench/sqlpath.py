"""What one statement costs on each way the store could run SQL (issue 31's choice).

The store today runs the per-job path as SQL strings on the driver's own connection
(``store/queries.py``) and the rest through SQLAlchemy Core. One layer must serve SQLite
and PostgreSQL alike; this measures, on a real database file with the real schema
and 2,000 jobs, the CPU per statement of:

* ``driver``: the DBAPI connection's ``execute`` (what ``queries.py`` does; SQLite only);
* ``exec_driver_sql``: SQLAlchemy's thin pass-through of a SQL string (either dialect,
  with the dialect's parameter style);
* ``core``: a SQLAlchemy Core statement, built once and run with new parameters (its
  compiled form cached by the engine);
* ``core built``: the same statement built anew for every call, as most store code
  does today.

Each for a read by primary key and an update by primary key, inside one transaction.
Figures are µs per statement, min/median/max over ``--repeats``.
Usage: ``python bench/sqlpath.py [--repeats 5] [--calls 5000]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from resource_controller.clock import SystemClock
from resource_controller.store import engine
from resource_controller.store import schema as t
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob


def seed(store: Store, n: int) -> list[str]:
    store.devices.register("h", "boot", [("d0", 0)])
    ids = []
    for _ in range(n):
        job = store.queue.enqueue(NewJob(command=["true"], submitter="bench", device_id="h:d0"))
        ids.append(job.id)
    return ids


def timed(calls: int, run: Callable[[int], object]) -> float:
    start = time.process_time()
    for i in range(calls):
        run(i)
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "rc.db", SystemClock())
        ids = seed(store, 2000)
        store.close()
        # One connection as the store opens its own, under SQLAlchemy for the Core ways.
        conn = engine.create_engine(Path(tmp) / "rc.db").connect()
        driver = conn.connection.driver_connection
        assert driver is not None
        jobs = t.jobs
        read_sql = "SELECT id, state, device_id, submitter FROM jobs WHERE id = ?"
        write_sql = "UPDATE jobs SET priority = ? WHERE id = ?"
        read_core = sa.select(jobs.c.id, jobs.c.state, jobs.c.device_id, jobs.c.submitter).where(
            jobs.c.id == sa.bindparam("job_id")
        )
        write_core = (
            sa.update(jobs)
            .where(jobs.c.id == sa.bindparam("job_id"))
            .values(priority=sa.bindparam("p"))
        )

        def pick(i: int) -> str:
            return ids[i % len(ids)]

        ways: dict[str, dict[str, Callable[[int], object]]] = {
            "driver": {
                "read": lambda i: driver.execute(read_sql, (pick(i),)).fetchone(),
                "write": lambda i: driver.execute(write_sql, (i % 7, pick(i))),
            },
            "exec_driver_sql": {
                "read": lambda i: conn.exec_driver_sql(read_sql, (pick(i),)).fetchone(),
                "write": lambda i: conn.exec_driver_sql(write_sql, (i % 7, pick(i))),
            },
            "core": {
                "read": lambda i: conn.execute(read_core, {"job_id": pick(i)}).fetchone(),
                "write": lambda i: conn.execute(write_core, {"job_id": pick(i), "p": i % 7}),
            },
            "core built": {
                "read": lambda i: conn.execute(
                    sa.select(jobs.c.id, jobs.c.state, jobs.c.device_id, jobs.c.submitter).where(
                        jobs.c.id == pick(i)
                    )
                ).fetchone(),
                "write": lambda i: conn.execute(
                    sa.update(jobs).where(jobs.c.id == pick(i)).values(priority=i % 7)
                ),
            },
        }
        print(f"µs of CPU per statement, {args.calls} calls x {args.repeats} repeats")
        print(f"{'way':18} {'read min/med/max':>22} {'write min/med/max':>22}")
        for name, kinds in ways.items():
            cells = []
            for kind in ("read", "write"):
                runs = []
                for _ in range(args.repeats):
                    with conn.begin():
                        runs.append(timed(args.calls, kinds[kind]))
                cells.append(f"{min(runs):6.1f} {statistics.median(runs):6.1f} {max(runs):6.1f}")
            print(f"{name:18} {cells[0]:>22} {cells[1]:>22}")
        store.close()


if __name__ == "__main__":
    main()
