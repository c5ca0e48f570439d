"""``GET /v1/usage`` over a long history (EXT-ACCT-2): 1,000,000 finished jobs by default.

Builds a store with ``--jobs`` finished jobs ending over the last ``--days`` days on
``--hosts`` × 8 devices, from ``--submitters`` people (a few heavy users, a long tail),
a tenth of the jobs on 2-8 devices of one host, seven in ten with a measured GPU
utilisation. Job and lease rows are written in bulk; the rollup is written the way
the controller writes it, by ``store/usage.account`` once per job in the order the jobs
ended, which also gives the rollup's cost per job. Then, for each ``--by`` and each
``--since``, it times ``Store.usage`` in process and ``GET /v1/usage`` from a real
``rc serve`` on the same database (``--repeats`` times each: min, median, max), and for
comparison the same question answered straight from the leases, by an index on their
release time (what the rollup replaces).

Usage: ``python bench/usage.py [--jobs 1000000] [--postgresql] [--json out.json]``;
``--migration N`` times only migration 0011 filling the rollup from N leases.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from resource_controller.clock import FakeClock
from resource_controller.core import usage as acct
from resource_controller.store import usage
from resource_controller.store.facade import Store

DAY = 86_400
RC = str(Path(sys.executable).parent / "rc")


def _timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """min, median and max of ``repeats`` calls, in milliseconds (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"min": min(times), "median": statistics.median(times), "max": max(times)}


def _fmt(t: dict[str, float]) -> str:
    return f"{t['min']:7.1f} {t['median']:7.1f} {t['max']:7.1f}"


def build(store: Store, args: argparse.Namespace, now: int) -> dict[str, float]:
    """The jobs, their leases and the rollup; returns what writing them cost."""
    rng = random.Random(args.seed)
    devices = [f"h{h:03d}:gpu{g}" for h in range(args.hosts) for g in range(8)]
    people = [f"user{i:04d}" for i in range(args.submitters)]
    weights = [1 / (i + 1) for i in range(len(people))]  # a few heavy users, a long tail
    start = now - args.days * DAY
    ends = sorted(rng.randrange(start, now) for _ in range(args.jobs))
    jobs: list[tuple[Any, ...]] = []
    leases: list[tuple[Any, ...]] = []
    plan: list[tuple[int, list[usage.Held], float | None]] = []
    for seq, end in enumerate(ends, 1):
        job_id = str(uuid.UUID(int=rng.getrandbits(128)))
        who = rng.choices(people, weights)[0]
        held = min(12 * 3600, max(5, int(rng.expovariate(1 / 1200))))
        width = rng.choice((2, 4, 8)) if rng.random() < 0.1 else 1
        first = rng.randrange(len(devices) // 8) * 8 + (rng.randrange(8) if width == 1 else 0)
        mine = devices[first : first + width]
        util = round(rng.uniform(0, 100), 1) if rng.random() < 0.7 else None
        jobs.append(
            (
                job_id,
                seq,
                json.dumps(["train"]),
                who,
                "succeeded",
                mine[0],
                "w-" + mine[0].split(":")[0],
                end - held - 5,
                end - held,
                end,
                ",".join(mine) if width > 1 else "",
                util,
            )
        )
        for d in mine:
            leases.append((str(uuid.uuid4()), d, who, job_id, end - held, end + 600, end))
        plan.append((end, [usage.Held(d, who, job_id, held) for d in mine], util))
    t0 = time.perf_counter()
    with store.tx() as db:
        db.many(
            "INSERT INTO jobs (id, seq, command, submitter, state, device_id, worker_id,"
            " submitted_at, started_at, finished_at, device_ids, gpu_util_mean)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            jobs,
        )
        db.many(
            "INSERT INTO leases (id, device_id, holder, job_id, acquired_at, expires_at,"
            " released_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            leases,
        )
    rows_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cpu0 = time.thread_time()
    for i in range(0, len(plan), 10_000):
        with store.tx() as db:
            for end, held_rows, util in plan[i : i + 10_000]:
                usage.account(db, end, held_rows, util)
    rollup_s, rollup_cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    with store.read() as db:
        marks = db.value("SELECT count(*) FROM usage_marks")
        totals = db.value("SELECT count(*) FROM usage_totals")
    return {
        "jobs": len(jobs),
        "leases": len(leases),
        "rows_seconds": rows_s,
        "rollup_seconds": rollup_s,
        "rollup_us_per_job": rollup_s / len(plan) * 1e6,
        "rollup_cpu_us_per_job": rollup_cpu / len(plan) * 1e6,
        "usage_marks": int(marks),
        "usage_totals": int(totals),
    }


_DIRECT = {
    "submitter": "holder",
    "device": "device_id",
    "host": "substr(device_id, 1, strpos(device_id, ':') - 1)",
}


def direct(store: Store, by: str, since: int) -> int:
    """The same question from the leases themselves, by an index on their release time:
    what the rollup replaces. Returns the number of groups."""
    with store.read() as db:
        rows = db.all(
            f"SELECT {_DIRECT[by]}, count(DISTINCT job_id), sum(released_at - acquired_at)"
            f" FROM leases WHERE released_at >= ? GROUP BY {_DIRECT[by]}",
            (store.now() - since,),
        )
    return len(rows)


@contextmanager
def served(tmp: Path, database: str) -> Iterator[str]:
    """A real ``rc serve`` on the bench's database; its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [RC, "serve", "--addr", f"127.0.0.1:{port}", "--data", str(tmp / "data")]
    if database:
        args += ["--database", database]
    env = dict(os.environ, RC_TOKENS="ctok:client")
    log = open(tmp / "serve.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                get(url, "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("rc serve did not answer") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def get(url: str, path: str) -> bytes:
    req = urllib.request.Request(url + path, headers={"Authorization": "Bearer ctok"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        body: bytes = resp.read()
        return body


def migration(leases: int, seed: int) -> dict[str, float]:
    """Migration 0011's cost on a store from before it: ``leases`` released leases at
    revision 0009 (SQLite), then the upgrade that fills the rollup, timed."""
    from alembic import command

    from resource_controller.store import engine

    rng = random.Random(seed)
    now = int(time.time())
    with tempfile.TemporaryDirectory(prefix="rc-usage-mig-") as tmp:
        path = Path(tmp) / "rc.db"
        eng = engine.create_engine(path)
        try:
            with eng.connect() as conn:
                command.upgrade(engine._alembic_config(conn), "0009")
                conn.commit()
            rows = []
            for i in range(leases):
                end = now - rng.randrange(30 * DAY)
                held = rng.randrange(60, 7200)
                device = f"h{rng.randrange(64):03d}:gpu{rng.randrange(8)}"
                who = f"user{rng.randrange(300):04d}"
                rows.append((f"l{i}", f"j{i}", device, who, end - held, end + 600, end))
            raw = eng.raw_connection()
            try:
                raw.cursor().executemany(
                    "INSERT INTO leases (id, job_id, device_id, holder, acquired_at,"
                    " expires_at, released_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                raw.commit()
            finally:
                raw.close()
            t0 = time.perf_counter()
            with eng.connect() as conn:
                command.upgrade(engine._alembic_config(conn), "head")
                conn.commit()
            took = time.perf_counter() - t0
        finally:
            eng.dispose()
    return {"leases": leases, "seconds": took}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--submitters", type=int, default=300)
    ap.add_argument("--since", nargs="+", default=["1d", "7d", "30d"])
    ap.add_argument("--by", nargs="+", default=list(acct.BY))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--postgresql", action="store_true", help="a throwaway PostgreSQL cluster")
    ap.add_argument("--no-http", action="store_true", help="skip the rc serve half")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--migration",
        type=int,
        default=0,
        metavar="N",
        help="only time migration 0011 filling the rollup from N released leases (SQLite)",
    )
    args = ap.parse_args()
    if args.migration:
        took = migration(args.migration, args.seed)
        print(f"migration 0011 over {took['leases']} leases: {took['seconds']:.1f} s")
        return
    out: dict[str, Any] = {"args": vars(args)}
    now = int(time.time()) // 3600 * 3600 + 1800
    cluster = None
    with tempfile.TemporaryDirectory(prefix="rc-usage-") as tmpdir:
        tmp = Path(tmpdir)
        database = ""
        if args.postgresql:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from support import pg

            cluster = pg.start()
            cluster.psql("CREATE DATABASE rc_bench")
            database = cluster.url("rc_bench")
        try:
            target: Path | str = database or tmp / "data" / "rc.db"
            (tmp / "data").mkdir()
            store = Store(target, FakeClock(now))
            built = build(store, args, now)
            out["build"] = built
            print(
                f"{built['jobs']} jobs, {built['leases']} leases; rollup written at"
                f" {built['rollup_us_per_job']:.0f} µs/job"
                f" ({built['rollup_cpu_us_per_job']:.0f} µs CPU): {built['usage_totals']}"
                f" groups, {built['usage_marks']} hourly marks"
            )
            results: dict[str, Any] = {}
            print(f"{'by':10} {'since':6} {'groups':>6}  store min/med/max ms  direct (leases)")
            with store.tx() as db:
                db.execute("CREATE INDEX bench_leases_released ON leases (released_at)")
                db.execute("ANALYZE")
            for by in args.by:
                for since_text in args.since:
                    since = acct.parse_since(since_text)
                    groups = len(store.views.usage(by, since).groups)
                    t_store = _timed(functools.partial(store.views.usage, by, since), args.repeats)
                    t_direct = _timed(functools.partial(direct, store, by, since), 3)
                    results[f"{by}/{since_text}"] = {
                        "groups": groups,
                        "store_ms": t_store,
                        "direct_ms": t_direct,
                    }
                    print(
                        f"{by:10} {since_text:6} {groups:6}  {_fmt(t_store)}      {_fmt(t_direct)}"
                    )
            store.close()
            if not args.no_http:
                print(f"{'by':10} {'since':6} GET /v1/usage min/med/max ms")
                with served(tmp, database) as url:
                    for by in args.by:
                        for since_text in args.since:
                            path = f"/v1/usage?by={by}&since={since_text}"
                            t_http = _timed(functools.partial(get, url, path), args.repeats)
                            results[f"{by}/{since_text}"]["http_ms"] = t_http
                            print(f"{by:10} {since_text:6} {_fmt(t_http)}")
            out["results"] = results
        finally:
            if cluster is not None:
                cluster.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
