"""Latency and throughput of the lease spine on loopback, each beside a same-run baseline.

Starts a real ``rc serve`` and one ``rc worker`` with four generic devices, then measures:

* ``rc run -d HOST:slot0 -- true`` wall time, next to ``flock /tmp/x true``;
* submit-to-running through the API alone (no CLI start-up);
* handoff: job B queued behind A on one device, A's exit to B's start;
* throughput: 200 ``true`` jobs from 8 concurrent ``rc run`` clients on 4 devices, and
  200 jobs through the API from one asyncio client;
* ``rc --help`` start-up next to ``python3 -c pass``.

Figures are min/median/max over repeats; ratios are against the baseline measured in
this same run, because these machines are noisy. ``--postgresql`` runs every figure a
second time with the controller on PostgreSQL (a throwaway cluster the bench starts,
``tests/support/pg.py``: Debian's ``postgresql``) and prints both side by side. Beside the API throughput it prints
the CPU each process spent per job (``/proc/<pid>/stat`` utime + stime over one 200-job
run, divided by the jobs) and each process's resident memory at rest and after.
Usage: ``python bench/latency.py [--repeats 30] [--only api] [--json results.json]``;
``--only api`` runs the API throughput and the per-job costs alone (for profiling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
HOST = "benchbox"


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` itself (not its children), from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # After the command name: state is field 3, utime 14 and stime 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (``VmRSS`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "n": len(samples),
    }


def ms(s: dict[str, float]) -> str:
    return f"median {s['median'] * 1e3:.1f} ms (min {s['min'] * 1e3:.1f}, max {s['max'] * 1e3:.1f}, n={int(s['n'])})"


class Fleet:
    """A controller and one worker with four devices, stopped by PID on exit."""

    def __init__(
        self,
        tmp: Path,
        worker_extra: str = "",
        worker_env: dict[str, str] | None = None,
        worker_url: str = "",
        database: str = "",
    ) -> None:
        self.tmp = tmp
        #: More worker.yaml lines (``poll_wait: 1s``) and environment for the worker.
        self.worker_extra = worker_extra
        self.worker_env = worker_env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        #: Where the worker dials (a proxy in front of ``url``); ``url`` when empty.
        self.worker_url = worker_url
        #: ``rc serve --database``: a PostgreSQL URL, or SQLite in the data directory.
        self.database = database
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Fleet:
        env = dict(os.environ, RC_TOKENS="wtok:worker,ctok:client,atok:admin")
        serve = [RC, "serve", "--addr", f"127.0.0.1:{self.port}", "--data", str(self.tmp / "data")]
        if self.database:
            serve += ["--database", self.database]
        self.procs.append(
            subprocess.Popen(
                serve,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(self.tmp / "controller.log", "wb"),
            )
        )
        self._wait(lambda: self.get("/v1/state") is not None, "controller")
        cfg = self.tmp / "worker.yaml"
        cfg.write_text(
            f"controller_url: {self.worker_url or self.url}\ntoken: wtok\nhost: {HOST}\n"
            f"state_dir: {self.tmp / 'worker-state'}\n"
            "devices: [slot0, slot1, slot2, slot3]\n" + self.worker_extra
        )
        self.procs.append(
            subprocess.Popen(
                [RC, "worker", "-c", str(cfg)],
                stdout=subprocess.DEVNULL,
                stderr=open(self.tmp / "worker.log", "wb"),
                env=self.worker_env,
            )
        )
        self._wait(lambda: len(self.get("/v1/devices") or []) == 4, "worker")
        return self

    def __exit__(self, *_: object) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()

    def get(self, path: str) -> Any:
        req = urllib.request.Request(self.url + path, headers={"Authorization": "Bearer ctok"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def _wait(self, ok: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if ok():
                return
            time.sleep(0.05)
        raise SystemExit(f"{what} did not come up; see {self.tmp}")

    @property
    def controller_pid(self) -> int:
        return self.procs[0].pid

    @property
    def worker_pid(self) -> int:
        return self.procs[1].pid

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            RC_CONTROLLER=self.url,
            RC_TOKEN="ctok",
            RC_SUBMITTER="bench",
            RC_CONFIG=str(self.tmp / "none.yaml"),
        )


def bench_cli(fleet: Fleet, repeats: int) -> dict[str, Any]:
    lock = fleet.tmp / "x"
    flock = [timed(["flock", str(lock), "true"]) for _ in range(repeats)]
    env = fleet.env()
    timed([RC, "run", "-d", f"{HOST}:slot0", "--", "true"], env)  # warm the page cache
    run = [timed([RC, "run", "-d", f"{HOST}:slot0", "--", "true"], env) for _ in range(repeats)]
    py = [timed([sys.executable, "-c", "pass"]) for _ in range(repeats)]
    helps = [timed([RC, "--help"]) for _ in range(repeats)]
    return {
        "rc_run_true": summary(run),
        "flock_true": summary(flock),
        "rc_run_over_flock": statistics.median(run) / statistics.median(flock),
        "rc_help": summary(helps),
        "python_pass": summary(py),
        "rc_help_over_python": statistics.median(helps) / statistics.median(py),
    }


async def _submit_to_running(client: httpx.AsyncClient, device: str) -> float:
    t0 = time.perf_counter()
    r = await client.post(
        "/v1/jobs", json={"device_id": device, "command": ["true"], "submitter": "bench"}
    )
    job = r.json()
    while job["state"] in ("queued", "assigned"):
        job = (await client.get(f"/v1/jobs/{job['id']}")).json()["job"]
    elapsed = time.perf_counter() - t0
    while job["state"] == "running":
        await asyncio.sleep(0.002)
        job = (await client.get(f"/v1/jobs/{job['id']}")).json()["job"]
    return elapsed


async def _submit_to_start(client: httpx.AsyncClient, device: str) -> float:
    """Submit to the job's own first instruction: the job prints its start time."""
    t0 = time.time_ns()
    r = await client.post(
        "/v1/jobs", json={"device_id": device, "command": ["date", "+%s%N"], "submitter": "bench"}
    )
    job = r.json()
    while job["state"] not in ("succeeded", "failed", "killed", "lost"):
        await asyncio.sleep(0.005)
        job = (await client.get(f"/v1/jobs/{job['id']}")).json()["job"]
    out = (await client.get(f"/v1/jobs/{job['id']}/logs?follow=false")).text
    return (int(out.split()[-1]) - t0) / 1e9


async def _handoff(client: httpx.AsyncClient, fleet: Fleet, device: str) -> float:
    body = {"device_id": device, "submitter": "bench"}
    a = (
        await client.post(
            "/v1/jobs", json={**body, "command": ["sh", "-c", "sleep 0.2; date +%s%N"]}
        )
    ).json()
    b = (await client.post("/v1/jobs", json={**body, "command": ["date", "+%s%N"]})).json()
    for job in (a, b):
        while job["state"] not in ("succeeded", "failed", "killed", "lost"):
            await asyncio.sleep(0.01)
            job = (await client.get(f"/v1/jobs/{job['id']}")).json()["job"]
    out_a = (await client.get(f"/v1/jobs/{a['id']}/logs?follow=false")).text
    out_b = (await client.get(f"/v1/jobs/{b['id']}/logs?follow=false")).text
    return (int(out_b.split()[-1]) - int(out_a.split()[-1])) / 1e9


async def _api_throughput(fleet: Fleet, n: int) -> float:
    async with httpx.AsyncClient(
        base_url=fleet.url, headers={"Authorization": "Bearer ctok"}, timeout=60
    ) as c:
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(32)

        async def submit() -> str:
            async with sem:
                r = await c.post("/v1/jobs", json={"command": ["true"], "submitter": "bench"})
                return str(r.json()["id"])

        await asyncio.gather(*(submit() for _ in range(n)))
        # Done when nothing is queued, assigned or running; cheap filtered reads, so the
        # bench's own polling does not compete with the work it measures.
        while True:
            busy = False
            for state in ("queued", "assigned", "running"):
                r = await c.get(f"/v1/jobs?state={state}&limit=1")
                busy = busy or bool(r.json()["jobs"])
            if not busy:
                break
            await asyncio.sleep(0.02)
        return n / (time.perf_counter() - t0)


def bench_cost(fleet: Fleet, n: int = 200) -> dict[str, Any]:
    """CPU per job of the controller and the worker over one API run of ``n`` jobs, and
    each process's resident memory before (at rest) and after."""
    pids = {"controller": fleet.controller_pid, "worker": fleet.worker_pid}
    time.sleep(0.5)  # let the start-up or the previous run settle
    rest = {k: rss_mib(p) for k, p in pids.items()}
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    rate = asyncio.run(_api_throughput(fleet, n))
    time.sleep(0.2)  # the last reports land
    after = {k: cpu_seconds(p) for k, p in pids.items()}
    out: dict[str, Any] = {"cost_jobs": n, "cost_rate": rate}
    for k, p in pids.items():
        out[f"{k}_cpu_ms_per_job"] = (after[k] - before[k]) * 1e3 / n
        out[f"{k}_rss_rest_mib"] = rest[k]
        out[f"{k}_rss_after_mib"] = rss_mib(p)
    return out


def print_cost(r: dict[str, Any]) -> None:
    for k in ("controller", "worker"):
        print(
            f"{k + ' CPU/job':<22}{r[f'{k}_cpu_ms_per_job']:.2f} ms "
            f"({r['cost_jobs']} API jobs at {r['cost_rate']:.0f} jobs/s); RSS "
            f"{r[f'{k}_rss_rest_mib']:.1f} MiB at rest -> {r[f'{k}_rss_after_mib']:.1f} MiB"
        )


async def bench_api(fleet: Fleet, repeats: int) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=fleet.url, headers={"Authorization": "Bearer ctok"}, timeout=30
    ) as c:
        await _submit_to_running(c, f"{HOST}:slot1")
        s2r = [await _submit_to_running(c, f"{HOST}:slot1") for _ in range(repeats)]
        s2s = [await _submit_to_start(c, f"{HOST}:slot3") for _ in range(repeats)]
        hand = [await _handoff(c, fleet, f"{HOST}:slot2") for _ in range(repeats)]
    return {
        "submit_to_running": summary(s2r),
        "submit_to_process_start": summary(s2s),
        "handoff": summary(hand),
    }


def bench_throughput(fleet: Fleet, n: int = 200, clients: int = 8) -> dict[str, Any]:
    env = fleet.env()

    def client(k: int) -> None:
        for _ in range(n // clients):
            subprocess.run([RC, "run", "--", "true"], env=env, check=True, capture_output=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    cli_rate = n / (time.perf_counter() - t0)
    api_rates = [asyncio.run(_api_throughput(fleet, n)) for _ in range(3)]
    return {"cli_jobs_per_s": cli_rate, "api_jobs_per_s": summary(api_rates)}


def byte_compile() -> None:
    """Compile the ``resource_controller`` the ``rc`` processes import (``PYTHONPATH``
    included): under ``PYTHONDONTWRITEBYTECODE`` a checkout never compiled would be
    measured compiling itself on every start."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("resource_controller")
    for where in (spec and spec.submodule_search_locations) or ():
        compileall.compile_dir(where, quiet=1)


def main() -> None:
    byte_compile()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--only",
        choices=["api"],
        help="api: only the API throughput (--repeats runs) and the per-job CPU and memory",
    )
    ap.add_argument(
        "--postgresql",
        action="store_true",
        help="run every figure on PostgreSQL too (a throwaway cluster), side by side",
    )
    args = ap.parse_args()
    machine = f"{platform.machine()} {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}"
    if args.only == "api":
        with tempfile.TemporaryDirectory(prefix="rc-bench-") as tmp, Fleet(Path(tmp)) as fleet:
            cost = bench_cost(fleet)
            rates = [asyncio.run(_api_throughput(fleet, 200)) for _ in range(args.repeats)]
        api = summary(rates)
        print(f"machine: {machine}")
        print(
            f"throughput API        median {api['median']:.1f} jobs/s (min {api['min']:.1f}, max {api['max']:.1f}, n={int(api['n'])})"
        )
        print_cost(cost)
        if args.json:
            args.json.write_text(
                json.dumps({"machine": machine, "api_jobs_per_s": api} | cost, indent=2)
            )
        return
    runs = {"sqlite": run_all(args.repeats, "")}
    if args.postgresql:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from support import pg

        cluster = pg.start()
        try:
            runs["postgresql"] = run_all(args.repeats, cluster.fresh_database())
        finally:
            cluster.stop()
    print(f"machine: {machine}")
    report(runs)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine} | runs, indent=2))


def run_all(repeats: int, database: str) -> dict[str, Any]:
    """Every figure, the controller on ``database`` (SQLite when empty)."""
    with (
        tempfile.TemporaryDirectory(prefix="rc-bench-") as tmp,
        Fleet(Path(tmp), database=database) as fleet,
    ):
        results: dict[str, Any] = {}
        results |= bench_cost(fleet)
        results |= bench_cli(fleet, repeats)
        results |= asyncio.run(bench_api(fleet, repeats))
        results |= bench_throughput(fleet)
    return results


#: (label, result key) of the timed figures, in the order printed.
TIMED = (
    ("rc run -- true", "rc_run_true"),
    ("flock x true", "flock_true"),
    ("API submit-to-running", "submit_to_running"),
    ("API submit-to-start", "submit_to_process_start"),
    ("handoff A exit->B", "handoff"),
    ("rc --help", "rc_help"),
    ("python3 -c pass", "python_pass"),
)


def report(runs: dict[str, dict[str, Any]]) -> None:
    """One column per backend; with two, the second's median over the first's."""
    names = list(runs)
    first = runs[names[0]]
    if len(names) > 1:
        print(f"{'':<22}" + "".join(f"{n:<44}" for n in names) + f"ratio {names[1]}/{names[0]}")
    for label, key in TIMED:
        cells = "".join(f"{ms(r[key]):<44}" for r in runs.values())
        ratio = ""
        if len(names) > 1:
            ratio = f"{runs[names[1]][key]['median'] / first[key]['median']:.2f}x"
        print(f"{label:<22}{cells}{ratio}")
    for r in runs.values():
        print(
            f"ratio rc/flock {r['rc_run_over_flock']:.1f}x, rc --help/python {r['rc_help_over_python']:.1f}x"
        )
    for name, r in runs.items():
        api = r["api_jobs_per_s"]
        print(
            f"[{name}] throughput rc run {r['cli_jobs_per_s']:.1f} jobs/s (8 clients, 4 devices,"
            f" 200 jobs); API median {api['median']:.1f} jobs/s (min {api['min']:.1f},"
            f" max {api['max']:.1f})"
        )
        print_cost(r)


if __name__ == "__main__":
    main()
