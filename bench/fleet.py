"""The controller at scale: many simulated workers in one process against a real ``rc serve``.

Each simulated worker speaks the worker protocol as ``rc worker`` does
(``worker/channel.py``): it registers through ``POST /v1/workers/register`` with the
worker token, heartbeats every ``--heartbeat`` seconds (first tick staggered over one
interval, as a fleet started at different times would), and long-polls
``GET /v1/workers/{id}/assignments?wait=30s`` in a loop, re-issuing a poll that waited
out its term at once (EXT-FAST-4). An assignment is reported ``running`` and then
``succeeded`` at once (phase *drain*), so the queue empties; in phase *hold* it is
reported ``running`` and named in every heartbeat from then on. All the workers share
one asyncio loop, each with its own client on the worker's HTTP/1.1 (``h1.aio``), as each
``rc worker`` has.

Per fleet size (``--devices``, 8 devices per worker) it measures, beside
``python3 -c pass`` timed in the same run:

* the controller's CPU at steady state, from ``/proc/<pid>/stat`` over ``--windows``
  windows of ``--window`` seconds, as a percentage of one core; the mean scheduling
  pass and the passes per second over the same windows (``GET /metrics``);
* ``GET /v1/state`` under that load, from the simulator's loop and from a client
  process of its own;
* submit latency (``POST /v1/jobs``, one at a time, 20 a second) under that load;
* then, with every device held (the controller stopped, the rows written through the
  store as its test fixture does) and ``--queue`` jobs queued: one scheduling pass
  timed in process against the same database file (queued jobs pinned to random
  devices, the case where no claim covers the whole fleet, and jobs for any device),
  and ``GET /v1/state`` from a restarted ``rc serve`` on that file;
* with ``--postgresql [N ...]``, the live phase again with N controllers (1, 2, 3 by
  default) on one PostgreSQL database (a throwaway cluster): the simulated workers
  spread over them, CPU and passes summed, submits going round (EXT-PG-2).

With ``--kinds`` the queue phase also times the kinds ``limits-pinned`` and
``limits-any``: the same queues from 100 submitters, each holding as many devices as its
limit (EXT-SHARE-1), so every queued job is over its limit and claims nothing.
``--queue-only`` skips the live phase (the devices are registered through the store).

Usage: ``python bench/fleet.py [--devices 100 1000 10000] [--queue 100 1000 10000]
[--repeats 5] [--kinds ...] [--queue-only] [--json out.json]``. Run ``.venv/bin/python -m compileall -q src`` first.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import json as jsonlib
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from resource_controller import errors
from resource_controller.h1 import aio, core

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
TOKENS = "wtok:worker,ctok:client,atok:admin"
PER_WORKER = 8
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "min": ordered[0],
        "median": statistics.median(ordered),
        "p99": p99,
        "max": ordered[-1],
        "n": len(ordered),
    }


def fmt(s: dict[str, float], unit: float = 1e3, suffix: str = "ms") -> str:
    return (
        f"{s['median'] * unit:.1f} {suffix} ({s['min'] * unit:.1f}-{s['max'] * unit:.1f}, "
        f"p99 {s['p99'] * unit:.1f}, n={int(s['n'])})"
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def python_pass(repeats: int) -> dict[str, float]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        samples.append(time.perf_counter() - t0)
    return summary(samples)


def raise_fd_limit() -> None:
    """Every simulated worker holds a connection; the controller inherits the limit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Controller:
    """A real ``rc serve`` on loopback with its own data directory, stopped by PID."""

    def __init__(self, data: Path, log: Path, database: str = "") -> None:
        self.data = data
        #: ``rc serve --database``: a PostgreSQL URL, else SQLite in ``data``.
        self.database = database
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Controller:
        env = dict(os.environ, RC_TOKENS=TOKENS)
        with open(self.log, "ab") as err:
            shared = ["--database", self.database] if self.database else []
            self.proc = subprocess.Popen(
                [
                    RC,
                    "serve",
                    "--addr",
                    f"127.0.0.1:{self.port}",
                    "--data",
                    str(self.data),
                    *shared,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            if self.proc.poll() is not None:
                raise SystemExit(f"rc serve exited; see {self.log}")
            time.sleep(0.1)
        raise SystemExit(f"rc serve did not come up; see {self.log}")

    def __exit__(self, *_: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@dataclass
class SimWorker:
    host: str
    devices: int = PER_WORKER
    worker_id: str = ""
    held: dict[str, int] = field(default_factory=dict)  #: job -> lease epoch, phase hold


@dataclass
class Counters:
    heartbeats: int = 0
    polls: int = 0
    assignments: int = 0
    errors: int = 0
    last_error: str = ""


class SimHttp:
    """One simulated worker's requests, on the worker's own client."""

    def __init__(self, url: str) -> None:
        self.end = core.endpoint(url)
        headers = {"Authorization": "Bearer wtok", "Content-Type": "application/json"}
        self.client = aio.HttpClient(headers)

    async def post(self, path: str, json: Any) -> aio.Answer:
        body = jsonlib.dumps(json).encode()
        return await self.client.request("POST", self.end, path, body, timeout=120.0)

    async def get(self, path: str, params: dict[str, str]) -> aio.Answer:
        target = path + "?" + "&".join(f"{k}={v}" for k, v in params.items())
        return await self.client.request("GET", self.end, target, timeout=120.0)

    async def aclose(self) -> None:
        await self.client.aclose()


class Fleet:
    """The simulated workers, one asyncio task pair each, over one connection pool."""

    def __init__(self, urls: list[str], devices: int, heartbeat: float, wait: str) -> None:
        """``urls``: the controllers; worker ``i`` dials ``urls[i % len(urls)]``, as a load
        balancer would spread them."""
        self.heartbeat = heartbeat
        self.wait = wait
        self.hold = False  #: phase: True = keep assignments running, False = finish them
        # 8 devices a worker; the last one takes what is left (100 = 12 x 8 + 4).
        sizes = [PER_WORKER] * (devices // PER_WORKER) + [devices % PER_WORKER] * bool(
            devices % PER_WORKER
        )
        self.workers = [SimWorker(f"sim{i:05d}", size) for i, size in enumerate(sizes)]
        self.count = Counters()
        # A client per simulated worker, over the worker's own plain HTTP/1.1 transport,
        # as each ``rc worker`` has: one pool for the whole fleet made httpcore scan its
        # 2,500 connections on every request, and the simulator, not the controller,
        # was what could not keep up at 10,000 devices.
        self.http = {w.host: SimHttp(urls[i % len(urls)]) for i, w in enumerate(self.workers)}
        self.tasks: list[asyncio.Task[None]] = []

    async def register_all(self, concurrency: int = 16) -> float:
        gate = asyncio.Semaphore(concurrency)

        async def one(w: SimWorker) -> None:
            names = [f"slot{i}" for i in range(w.devices)]
            body: dict[str, Any] = {
                "host": w.host,
                "devices": [{"name": n} for n in names],
                "labels": None,  # WRK-043: null when the probe pass found nothing
                "declared_labels": {n: {} for n in names},
            }
            async with gate:
                r = await self.http[w.host].post("/v1/workers/register", json=body)
                assert r.is_success, r
                w.worker_id = r.json()["worker_id"]
            # As rc worker does (WRK-040): heartbeat and poll from its own registration on.
            self.tasks.append(asyncio.create_task(self._heartbeats(w)))
            self.tasks.append(asyncio.create_task(self._polls(w)))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(w) for w in self.workers))
        return time.perf_counter() - t0

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.http.values():
            await client.aclose()

    def _failed(self, what: str) -> None:
        self.count.errors += 1
        self.count.last_error = what

    async def _heartbeats(self, w: SimWorker) -> None:
        await asyncio.sleep(random.uniform(0, self.heartbeat))
        while True:
            body = {"running_job_ids": list(w.held)} if w.held else {}
            try:
                r = await self.http[w.host].post(f"/v1/workers/{w.worker_id}/heartbeat", json=body)
                self.count.heartbeats += 1
                if not r.is_success:
                    self._failed(f"heartbeat {r.status_code}")
            except errors.TransportError as exc:
                self._failed(f"heartbeat {exc!r}")
            await asyncio.sleep(self.heartbeat)

    async def _polls(self, w: SimWorker) -> None:
        path = f"/v1/workers/{w.worker_id}/assignments"
        while True:
            t0 = time.monotonic()
            try:
                r = await self.http[w.host].get(path, params={"wait": self.wait})
            except errors.TransportError as exc:
                self._failed(f"poll {exc!r}")
                await asyncio.sleep(2)  # WRK-061
                continue
            self.count.polls += 1
            if r.status_code == 200:
                for a in r.json().get("assignments") or []:
                    self.count.assignments += 1
                    await self._run(w, a)
                continue  # WRK-063: poll again at once after starting work
            if r.status_code != 204:
                self._failed(f"poll {r.status_code}")
                await asyncio.sleep(2)
            elif time.monotonic() - t0 < 15:
                await asyncio.sleep(0.25)  # EXT-FAST-4: an early empty answer

    async def _run(self, w: SimWorker, a: dict[str, Any]) -> None:
        job, epoch = a["job_id"], a.get("lease_epoch")
        base = {"worker_id": w.worker_id, **({"lease_epoch": epoch} if epoch else {})}
        await self._status(w, job, {**base, "state": "running"})
        if self.hold:
            w.held[job] = epoch or 0
            return
        await self._status(w, job, {**base, "state": "succeeded", "exit_code": 0})

    async def _status(self, w: SimWorker, job: str, body: dict[str, Any]) -> None:
        try:
            r = await self.http[w.host].post(f"/v1/jobs/{job}/status", json=body)
            if not r.is_success:
                self._failed(f"status {r.status_code} {r.content[:80]!r}")
        except errors.TransportError as exc:
            self._failed(f"status {exc!r}")


def pass_metrics(text: str) -> tuple[float, float]:
    """(sum, count) of ``rc_scheduling_pass_seconds`` from a ``/metrics`` page."""
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("rc_scheduling_pass_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("rc_scheduling_pass_seconds_count"):
            count = float(line.split()[-1])
    return total, count


async def timed_gets(client: httpx.AsyncClient, path: str, repeats: int) -> dict[str, float]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = await client.get(path)
        r.raise_for_status()
        _ = r.content
        samples.append(time.perf_counter() - t0)
        await asyncio.sleep(0.2)
    return summary(samples)


#: A client of its own: ``GET`` a path ``repeats`` times, 0.2 s apart, and print the
#: seconds each took as JSON. The simulator's event loop runs 1,250 workers' traffic,
#: and timing a 2.5 MB answer from inside it measures the simulator's backlog too.
_OWN_CLIENT = """
import json, sys, time, httpx
url, path, token, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = []
with httpx.Client(base_url=url, headers={"Authorization": "Bearer " + token}, timeout=120) as c:
    c.get(path).raise_for_status()
    for _ in range(n):
        t0 = time.perf_counter()
        r = c.get(path)
        r.raise_for_status()
        _ = r.content
        out.append(time.perf_counter() - t0)
        time.sleep(0.2)
print(json.dumps(out))
"""


async def own_client_gets(url: str, path: str, repeats: int) -> dict[str, float]:
    """``timed_gets`` from a separate process (``_OWN_CLIENT``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWN_CLIENT, url, path, "ctok", str(repeats),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the {path} client exited {proc.returncode}")
    return summary(json.loads(out))


async def live_phase(
    ctls: list[Controller], devices: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Register the fleet, let it settle, then measure CPU, ``/v1/state`` and submits;
    with several controllers, CPU and passes are their sums and submits go round."""
    ctl = ctls[0]
    fleet = Fleet([c.url for c in ctls], devices, args.heartbeat, args.wait)
    clients = [
        httpx.AsyncClient(base_url=c.url, headers={"Authorization": "Bearer ctok"}, timeout=60)
        for c in ctls
    ]
    client = clients[0]

    def cpu_all() -> float:
        return sum(cpu_seconds(c.pid) for c in ctls)

    async def passes_all() -> tuple[float, float]:
        seen = [pass_metrics((await c.get("/metrics")).text) for c in clients]
        return sum(s[0] for s in seen), sum(s[1] for s in seen)

    out: dict[str, Any] = {"devices": devices, "workers": len(fleet.workers)}
    out["controllers"] = len(ctls)
    try:
        out["register_s"] = await fleet.register_all()
        await asyncio.sleep(args.heartbeat + 2)  # every worker heartbeated and polls
        cpu, sim_cpu, passes = [], [], []
        for _ in range(args.windows):
            m0 = await passes_all()
            c0, s0, t0 = cpu_all(), time.process_time(), time.monotonic()
            await asyncio.sleep(args.window)
            c1, s1, t1 = cpu_all(), time.process_time(), time.monotonic()
            m1 = await passes_all()
            cpu.append((c1 - c0) / (t1 - t0))
            sim_cpu.append((s1 - s0) / (t1 - t0))
            n = m1[1] - m0[1]
            passes.append(((m1[0] - m0[0]) / n if n else 0.0, n / (t1 - t0)))
        out["cpu"] = summary(cpu)
        out["sim_cpu"] = summary(sim_cpu)
        out["pass_mean_s"] = summary([p[0] for p in passes])
        out["passes_per_s"] = summary([p[1] for p in passes])
        out["state"] = await timed_gets(client, "/v1/state", args.repeats)
        out["state_own_client"] = await own_client_gets(ctl.url, "/v1/state", args.repeats)
        lat = []
        c0, t0 = cpu_all(), time.monotonic()
        for k in range(args.submits):
            s = time.perf_counter()
            r = await clients[k % len(clients)].post(
                "/v1/jobs", json={"command": ["true"], "submitter": "bench"}
            )
            lat.append(time.perf_counter() - s)
            if r.status_code != 201:
                raise SystemExit(f"submit answered {r.status_code}: {r.text}")
            await asyncio.sleep(max(0.0, 0.05 - (time.perf_counter() - s)))
        out["submit"] = summary(lat)
        out["cpu_submitting"] = (cpu_all() - c0) / (time.monotonic() - t0)
        await asyncio.sleep(1)
        out["sim"] = dict(fleet.count.__dict__)
    finally:
        await fleet.stop()
        for c in clients:
            await c.aclose()
    return out


@contextlib.contextmanager
def store_at(data: Path) -> Iterator[Any]:
    """The controller's own store on its database file, with the controller stopped."""
    from resource_controller.clock import SystemClock
    from resource_controller.store.facade import Store

    store = Store(data / "rc.db", SystemClock())
    try:
        yield store
    finally:
        store.close()


def hold_every_device(data: Path, holders: int = 0) -> list[str]:
    """Every ready device busy under an assigned job, as the store's test fixture does:
    all under ``holder``, or, with ``holders``, under ``user00``.. in turn."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from support import store_helpers

    with store_at(data) as store:
        ids = [s.device.id for s in store.views.devices()]
        for i, device_id in enumerate(ids):
            who = user(i % holders) if holders else "holder"
            with contextlib.suppress(Exception):
                store_helpers.allocate_directly(store, device_id, who)
    return ids


def user(i: int) -> str:
    return f"user{i:02d}"


def register_fleet(data: Path, devices: int) -> None:
    """The devices of ``devices // PER_WORKER`` hosts, registered through the store (no
    live phase: ``--queue-only``)."""
    data.mkdir(parents=True, exist_ok=True)
    with store_at(data) as store:
        for w in range(-(-devices // PER_WORKER)):
            names = [f"gpu{i}" for i in range(min(PER_WORKER, devices - w * PER_WORKER))]
            store.devices.register(f"host{w:05d}", "boot", [(n, 0) for n in names])


def enqueue(
    data: Path, n: int, pins: list[str] | None, rng: random.Random, submitters: int = 0
) -> None:
    from resource_controller.store.jobs import NewJob

    with store_at(data) as store:
        for i in range(n):
            pin = rng.choice(pins) if pins else ""
            who = user(i % submitters) if submitters else "bench"
            store.queue.enqueue(NewJob(command=["true"], submitter=who, device_id=pin))


def time_passes(data: Path, repeats: int, limit: int = 0) -> dict[str, float]:
    """A pass on the store, timed in this process with the heap settled as ``rc serve``
    settles its own before serving (else a full collection of this process's heap lands
    in one pass in a few: 12.9 ms against 50.8 ms). ``limit``: every submitter may hold
    that many devices (EXT-SHARE-1)."""
    from resource_controller import heap
    from resource_controller.core.share import SubmitterLimits

    with store_at(data) as store:
        if limit:
            store.limits = SubmitterLimits(default=limit)
        store.queue.run_pass()  # warm: statements compiled, pages cached
        heap.settle()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            store.queue.run_pass()
            samples.append(time.perf_counter() - t0)
    return summary(samples)


async def state_of(ctl: Controller, repeats: int) -> dict[str, float]:
    async with httpx.AsyncClient(
        base_url=ctl.url, headers={"Authorization": "Bearer ctok"}, timeout=120
    ) as client:
        await client.get("/v1/state")  # warm
        return await timed_gets(client, "/v1/state", repeats)


#: The queue kinds: jobs pinned to random devices, or for any device, from one
#: submitter; and the same from ``SUBMITTERS`` submitters, each holding its limit's worth
#: of the devices, so every queued job is over its submitter's limit and the pass walks
#: the whole queue claiming nothing (EXT-SHARE-1).
KINDS = ("pinned", "any", "limits-pinned", "limits-any")
SUBMITTERS = 100


def queue_phase(data: Path, log: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every device held, the queue grown step by step: pass and ``/v1/state`` per length."""
    rng = random.Random(14)
    out: dict[str, Any] = {}
    for kind in args.kinds:
        limited = kind.startswith("limits-")
        # A fresh copy per kind, so one kind's queue never sits in front of the other's.
        work = data.parent / f"{data.name}-{kind}"
        subprocess.run(["cp", "-a", str(data), str(work)], check=True)
        ids = hold_every_device(work, SUBMITTERS if limited else 0)
        limit = -(-len(ids) // SUBMITTERS) if limited else 0
        have = 0
        for q in sorted(args.queue):
            pins = ids if kind.endswith("pinned") else None
            enqueue(work, q - have, pins, rng, SUBMITTERS if limited else 0)
            have = q
            row: dict[str, Any] = {"pass": time_passes(work, args.repeats, limit)}
            if kind == "pinned" and not args.queue_only:
                with Controller(work, log) as ctl:
                    row["state"] = asyncio.run(state_of(ctl, args.repeats))
            out[f"{kind}:{q}"] = row
            print(f"  queue {kind} {q}: pass {fmt(row['pass'])}", flush=True)
            if "state" in row:
                print(f"  queue {kind} {q}: GET /v1/state {fmt(row['state'])}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--queue", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--heartbeat", type=float, default=10.0)
    ap.add_argument("--wait", default="30s")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--submits", type=int, default=200)
    ap.add_argument("--no-queue", action="store_true", help="skip the queue-length phase")
    ap.add_argument(
        "--queue-only",
        action="store_true",
        help="skip the live phase: the devices are registered through the store",
    )
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument(
        "--postgresql",
        type=int,
        nargs="*",
        metavar="N",
        help="the live phase again on PostgreSQL (a throwaway cluster) with N controllers"
        " each (default 1 2 3); the queue phase stays on SQLite",
    )
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    raise_fd_limit()
    # SIGTERM unwinds like Ctrl-C, so every rc serve started here is stopped by its PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {"python_pass": python_pass(args.repeats), "fleets": []}
    print(f"python3 -c pass: {fmt(results['python_pass'])}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="rc-fleet-"))
    counts: list[int] = []
    cluster = None
    if args.postgresql is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from support import pg

        counts = args.postgresql or [1, 2, 3]
        cluster = pg.start()
        atexit.register(cluster.stop)  # stopped however the run ends
    for devices in args.devices:
        data, log = tmp / f"data-{devices}", tmp / f"controller-{devices}.log"
        print(f"{devices} devices ({-(-devices // PER_WORKER)} workers):", flush=True)
        if args.queue_only:
            register_fleet(data, devices)
            row = {"devices": devices}
        else:
            with Controller(data, log) as ctl:
                row = asyncio.run(live_phase([ctl], devices, args))
            print_live(row)
        if not args.no_queue:
            row["queue"] = queue_phase(data, log, args)
        results["fleets"].append(row)
        for n in counts:
            assert cluster is not None
            url = cluster.fresh_database()
            print(f"  on PostgreSQL, {n} controller(s):", flush=True)
            with contextlib.ExitStack() as stack:
                ctls = [
                    stack.enter_context(Controller(tmp / f"pg{n}-{i}-{devices}", log, url))
                    for i in range(n)
                ]
                pg_row = asyncio.run(live_phase(ctls, devices, args))
            print_live(pg_row)
            results["fleets"].append(pg_row | {"database": "postgresql"})
    results["python_pass_after"] = python_pass(args.repeats)
    print(f"python3 -c pass (after): {fmt(results['python_pass_after'])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if not args.keep:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    else:
        print(f"data kept in {tmp}")


def print_live(row: dict[str, Any]) -> None:
    print(
        f"  register {row['register_s']:.1f} s; controller CPU "
        f"{fmt(row['cpu'], 100, '%')}; simulator CPU {fmt(row['sim_cpu'], 100, '%')}\n"
        f"  scheduling passes {fmt(row['passes_per_s'], 1, '/s')}, mean "
        f"{fmt(row['pass_mean_s'])}\n"
        f"  GET /v1/state {fmt(row['state'])}; from a client process of its own "
        f"{fmt(row['state_own_client'])}\n"
        f"  submit {fmt(row['submit'])}; controller CPU while submitting "
        f"{row['cpu_submitting'] * 100:.1f} %\n  simulator: {row['sim']}",
        flush=True,
    )


if __name__ == "__main__":
    main()
