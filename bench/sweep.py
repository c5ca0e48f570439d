"""A 10,000-task array (EXT-ARRAY-1): its submit and the passes over a queue holding it.

On the store (SQLite file, or ``--database postgresql://...``), each repeat on a fresh database
with 16 devices: the array's one-transaction submit (target <= 1 s), its first pass (which places
16 tasks), then passes over the queue it leaves (9,984 tasks waiting, every device busy; target
<= 50 ms), and the same with a ``%8`` cap (8 placed, 8 devices free). Baseline in the same run:
1,000 single-job enqueues, per task, and the passes over 10,000 single jobs queued the same way.
Then over HTTP with a real ``rc serve``: ``POST /v1/jobs`` with ``array`` and ``GET /v1/arrays``.
Figures are min/median/max over repeats. Usage: ``python bench/sweep.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resource_controller.clock import SystemClock
from resource_controller.core import arrays
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob

BIN = Path(sys.executable).parent
TASKS = 10_000
DEVICES = 16
PASSES = 20


def _store(database: str, where: Path, n: int) -> Store:
    store = Store(database or where / f"rc-{n}.db", SystemClock())
    store.devices.register("box", "boot-1", [(f"gpu{i}", 0) for i in range(DEVICES)])
    return store


def _timed(action: Callable[[], Any]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def _passes(store: Store) -> float:
    """The median of ``PASSES`` passes over the queue as it stands."""
    return statistics.median(_timed(store.queue.run_pass) for _ in range(PASSES))


def _fresh(database: str) -> str:
    if not database:
        return ""
    import psycopg

    name = f"rcbench_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    where, sep, query = database.partition("?")
    return where.rsplit("/", 1)[0] + "/" + name + sep + query


def store_round(database: str, where: Path, n: int) -> dict[str, float]:
    new = NewJob(command=["sweep"], submitter="bench")
    out: dict[str, float] = {}
    for cap in ("", "%8"):
        store = _store(_fresh(database), where, n * 10 + len(cap))
        spec = arrays.parse(f"0-{TASKS - 1}{cap}")
        out[f"submit{cap}"] = _timed(lambda: store.arrays.submit(new, spec))  # noqa: B023
        out[f"first_pass{cap}"] = _timed(store.queue.run_pass)
        out[f"pass{cap}"] = _passes(store)
        store.close()
    store = _store(_fresh(database), where, n * 10 + 5)
    out["single_enqueue_per_task"] = _timed(lambda: [store.queue.enqueue(new) for _ in range(1000)])
    out["single_enqueue_per_task"] /= 1000
    for _ in range(TASKS - 1000):
        store.queue.enqueue(new)
    out["first_pass_single_jobs"] = _timed(store.queue.run_pass)
    out["pass_single_jobs"] = _passes(store)
    store.close()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(url: str, token: str, method: str, path: str, body: object = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        raw = answer.read()
        return json.loads(raw) if raw else None


def http_rounds(where: Path, repeats: int) -> dict[str, list[float]]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, RC_TOKENS="wtok:worker,ctok:client")
    serve = [str(BIN / "rc"), "serve", "--addr", f"127.0.0.1:{port}", "--data", str(where / "d")]
    log = open(where / "serve.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(serve, env=env, stdout=log, stderr=subprocess.STDOUT)
    out: dict[str, list[float]] = {"http_submit": [], "http_view": []}
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                _call(url, "ctok", "GET", "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the controller did not answer") from None
                time.sleep(0.05)
        devices = [{"name": f"gpu{i}"} for i in range(DEVICES)]
        _call(url, "wtok", "POST", "/v1/workers/register", {"host": "box", "devices": devices})
        for _ in range(repeats):
            body = {"command": ["true"], "submitter": "bench", "array": f"0-{TASKS - 1}"}
            began = time.perf_counter()
            made = _call(url, "ctok", "POST", "/v1/jobs", body)
            out["http_submit"].append(time.perf_counter() - began)
            assert made["size"] == TASKS, made
            view = f"/v1/arrays/{made['id']}"
            out["http_view"].append(_timed(lambda: _call(url, "ctok", "GET", view)))  # noqa: B023
            _call(url, "ctok", "POST", f"/v1/jobs/{made['id']}/kill", {"submitter": "bench"})
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
    return out


def _figures(samples: list[float]) -> dict[str, float]:
    return {"min": min(samples), "median": statistics.median(samples), "max": max(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database", default="", help="a postgresql:// URL; default SQLite")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        rounds = [store_round(args.database, Path(where), n) for n in range(args.repeats)]
        http = http_rounds(Path(where), args.repeats) if not args.database else {}
    results = {key: _figures([r[key] for r in rounds]) for key in rounds[0]}
    results.update({key: _figures(v) for key, v in http.items()})
    backend = "postgresql" if args.database else "sqlite"
    print(f"{TASKS}-task array, {DEVICES} devices, {backend}, {args.repeats} repeats (ms):")
    for key, f in results.items():
        scale = 1e6 if key == "single_enqueue_per_task" else 1e3
        unit = "us" if scale == 1e6 else "ms"
        print(
            f"  {key:26} min {f['min'] * scale:8.1f}  median {f['median'] * scale:8.1f}"
            f"  max {f['max'] * scale:8.1f} {unit}"
        )
    per_task = results["submit"]["median"] / TASKS
    print(
        f"  array submit per task / single enqueue: "
        f"{per_task / results['single_enqueue_per_task']['median']:.3f}"
    )
    for what in ("first_pass", "pass"):
        ratio = results[what]["median"] / results[f"{what}_single_jobs"]["median"]
        print(f"  {what} over the array / over {TASKS} single jobs: {ratio:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
