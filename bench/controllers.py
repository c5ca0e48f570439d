"""Several controllers on one PostgreSQL database (EXT-PG-2, EXT-PG-8), each figure beside
a same-run baseline: one controller on SQLite.

* API throughput: 200 ``true`` jobs submitted through the API, spread over the
  controllers, run by two workers of four devices each that list every controller;
  with 1, 2 and 3 controllers on PostgreSQL and 1 on SQLite.
  Each worker lists the controllers starting at a different one (``--no-spread``: all
  in the same order, so every worker talks to the first), so the workers' polls and
  reports are spread over the controllers as a deployment would spread them. Each
  figure comes with the CPU each process spent per job (``bench/cpu.py``: the
  controllers, the workers, their jobs, PostgreSQL, this load generator, and every
  other process on the machine) and the machine's busy share of its cores: on a
  machine whose cores the single controller already keeps busy, a second one can only
  share them.
Takeover after a leader's death or freeze is ``bench/failover.py``'s.

PostgreSQL comes from Debian's ``postgresql`` package: the bench starts a throwaway
cluster of its own (``tests/support/pg.py``). Figures are min/median/max over repeats.
Usage: ``python bench/controllers.py [--repeats 3] [--jobs 200] [--no-spread] [--json F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import pg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu import Group, Meter, descendants
from latency import RC, free_port, summary

TOKENS = "wtok:worker,ctok:client,atok:admin"
HOSTS = ("w1", "w2")
DEVICES = ("slot0", "slot1", "slot2", "slot3")


def _get(url: str, path: str) -> Any:
    req = urllib.request.Request(url + path, headers={"Authorization": "Bearer ctok"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def _wait(ok: Callable[[], bool], what: str, bound: float = 30) -> float:
    """Seconds until ``ok()``; exits the bench when it never comes."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound:
        if ok():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise SystemExit(f"{what} did not happen within {bound} s")


class Controllers:
    """``n`` controllers on ``database`` (SQLite in their data directory when empty) and
    the workers, stopped by PID on exit."""

    def __init__(self, tmp: Path, n: int, database: str, spread: bool = True) -> None:
        self.tmp, self.database, self.spread = tmp, database, spread
        self.ports = [free_port() for _ in range(n)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.servers: list[subprocess.Popen[bytes] | None] = [None] * n
        self.workers: list[subprocess.Popen[bytes]] = []

    def start(self, i: int) -> None:
        args = [RC, "serve", "--addr", f"127.0.0.1:{self.ports[i]}"]
        args += ["--data", str(self.tmp / f"data{i}")]
        if self.database:
            args += ["--database", self.database]
        self.servers[i] = subprocess.Popen(
            args,
            env=dict(os.environ, RC_TOKENS=TOKENS),
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / f"controller{i}.log", "ab"),  # noqa: SIM115
        )
        _wait(lambda: _get(self.urls[i], "/v1/state") is not None, f"controller {i}")

    def __enter__(self) -> Controllers:
        for i in range(len(self.ports)):
            self.start(i)
        for k, host in enumerate(HOSTS):
            cfg = self.tmp / f"{host}.yaml"
            first = k % len(self.urls) if self.spread else 0
            urls = self.urls[first:] + self.urls[:first]
            cfg.write_text(
                f"controller_url: {','.join(urls)}\ntoken: wtok\nhost: {host}\n"
                f"state_dir: {self.tmp / ('state-' + host)}\n"
                f"devices: [{', '.join(DEVICES)}]\n"
            )
            self.workers.append(
                subprocess.Popen(
                    [RC, "worker", "-c", str(cfg)],
                    stdout=subprocess.DEVNULL,
                    stderr=open(self.tmp / f"{host}.log", "ab"),
                )
            )
        want = len(HOSTS) * len(DEVICES)
        _wait(lambda: len(_get(self.urls[0], "/v1/devices") or []) == want, "the workers")
        return self

    def __exit__(self, *_: object) -> None:
        for p in [*self.workers, *self.servers]:
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()

    def leader(self) -> int | None:
        for i, url in enumerate(self.urls):
            if self.servers[i] is None or self.servers[i].poll() is not None:  # type: ignore[union-attr]
                continue
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                    if json.loads(r.read()).get("leader"):
                        return i
            except OSError:
                continue
        return None


async def _throughput(urls: list[str], n: int) -> float:
    """Jobs per second for ``n`` jobs submitted round-robin over ``urls`` until none is
    queued, assigned or running."""
    headers = {"Authorization": "Bearer ctok"}
    clients = [httpx.AsyncClient(base_url=u, headers=headers, timeout=60) for u in urls]
    try:
        sem = asyncio.Semaphore(32)
        t0 = time.perf_counter()

        async def submit(k: int) -> None:
            async with sem:
                c = clients[k % len(clients)]
                r = await c.post("/v1/jobs", json={"command": ["true"], "submitter": "bench"})
                r.raise_for_status()

        await asyncio.gather(*(submit(k) for k in range(n)))
        for turn in itertools.count():
            # The checks go round the controllers, as the submits do, so that the
            # bench's own reads do not weigh on the first alone.
            c, busy = clients[turn % len(clients)], False
            for state in ("queued", "assigned", "running"):
                r = await c.get(f"/v1/jobs?state={state}&limit=1")
                busy = busy or bool(r.json()["jobs"])
                if busy:
                    break
            if not busy:
                return n / (time.perf_counter() - t0)
            await asyncio.sleep(0.02)
        raise AssertionError("unreachable")
    finally:
        for c in clients:
            await c.aclose()


def _groups(ctl: Controllers, postmaster: int | None) -> list[Group]:
    """The processes whose CPU a run is charged: ours by name, then every other one."""
    groups = [
        Group("controllers", lambda: [p.pid for p in ctl.servers if p is not None]),
        Group("workers", lambda: [w.pid for w in ctl.workers]),
        Group("jobs", lambda: [w.pid for w in ctl.workers], "reaped"),
    ]
    if postmaster is not None:
        groups.append(Group("postgres", lambda: descendants(postmaster), "all"))
    groups += [Group(f"controller{i}", lambda p=p: [p.pid]) for i, p in enumerate(ctl.servers)]  # type: ignore[misc]
    return groups


def bench_throughput(
    tmp: Path,
    n: int,
    database: str,
    jobs: int,
    repeats: int,
    postmaster: int | None = None,
    spread: bool = True,
) -> dict[str, Any]:
    """Jobs/s over ``repeats`` runs, and per run where the CPU went (``cpu.Meter``)."""
    runs: list[dict[str, float]] = []
    with Controllers(tmp, n, database, spread) as ctl:
        asyncio.run(_throughput(ctl.urls, 20))  # warm up
        for _ in range(repeats):
            meter = Meter(_groups(ctl, postmaster))
            meter.start()
            rate = asyncio.run(_throughput(ctl.urls, jobs))
            meter.stop()
            runs.append({"rate": rate, **meter.report(jobs)})
    out = summary([r["rate"] for r in runs])
    out["runs"] = runs  # type: ignore[assignment]
    return out


def _cpu_line(runs: list[dict[str, float]], n: int) -> str:
    """Median CPU ms per job of each process group over the runs, and the machine."""

    def med(key: str) -> float:
        values = sorted(r.get(key, 0.0) for r in runs)
        return values[len(values) // 2]

    per = [med(f"ms_per_job.controller{i}") for i in range(n)]
    each = "/".join(f"{ms:.1f}" for ms in per)
    ours = sum(
        med(f"ms_per_job.{g}") for g in ("controllers", "workers", "jobs", "postgres", "client")
    )
    others = med("ms_per_job.machine") - ours
    return (
        f"    CPU ms/job: controllers {med('ms_per_job.controllers'):.1f} ({each}),"
        f" workers {med('ms_per_job.workers'):.1f}, jobs {med('ms_per_job.jobs'):.1f},"
        f" postgres {med('ms_per_job.postgres'):.1f}, client {med('ms_per_job.client'):.1f};"
        f" ours {ours:.1f}, other processes {max(0.0, others):.1f};"
        f" machine busy {100 * med('machine_busy'):.0f}% of {os.cpu_count()} cores;"
        f" a core per controller would cap it at {1000 / max(max(per), 1e-3):.0f} jobs/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--no-spread", action="store_true", help="every worker talks to the first")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    cluster = pg.start()
    postmaster = int((cluster.root / "data" / "postmaster.pid").read_text().split()[0])
    spread = not args.no_spread
    results: dict[str, Any] = {"machine": machine}
    try:
        with tempfile.TemporaryDirectory(prefix="rc-bench-") as root:
            run = 0

            def fresh() -> Path:
                nonlocal run
                run += 1
                path = Path(root) / f"run{run}"
                path.mkdir()
                return path

            results["sqlite_1"] = bench_throughput(fresh(), 1, "", args.jobs, args.repeats)
            for n in (1, 2, 3):
                url = cluster.fresh_database()
                results[f"postgresql_{n}"] = bench_throughput(
                    fresh(), n, url, args.jobs, args.repeats, postmaster, spread
                )
    finally:
        cluster.stop()
    base = results["sqlite_1"]["median"]
    print(f"machine: {machine}")
    print(f"API throughput, {args.jobs} jobs, 8 devices on 2 workers (jobs/s, median min-max):")
    print(f"  workers spread over the controllers: {'yes' if spread else 'no'}")
    for key in ("sqlite_1", "postgresql_1", "postgresql_2", "postgresql_3"):
        s = results[key]
        print(
            f"  {key:<14} {s['median']:7.1f} ({s['min']:.1f}-{s['max']:.1f})"
            f"  ratio to sqlite_1 {s['median'] / base:.2f}x"
        )
        print(_cpu_line(s["runs"], int(key.rsplit("_", 1)[1])))
    two_over_one = results["postgresql_2"]["median"] / results["postgresql_1"]["median"]
    print(f"  postgresql 2 controllers / 1: {two_over_one:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
