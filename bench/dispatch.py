"""CPU per request through the controller's whole ASGI app, in process: what routing,
authentication, body parsing and the response cost beside the route's own work.

No sockets and no server: each request goes straight into ``create_app``'s app with a
real store (SQLite in a temporary directory) behind it, so the figure is the
controller's share of a request without the HTTP parser. CPU is ``process_time`` (the
store thread included), which a busy neighbour disturbs far less than wall time.
``--other-src DIR`` measures another checkout's ``src`` (byte-compiled) the same way,
the two interleaved round by round. Usage: ``python bench/dispatch.py [--rounds 5]
[--requests 1000] [--other-src DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def measure(n: int) -> dict[str, float]:
    """µs of CPU per request, by request."""
    from resource_controller.clock import FakeClock
    from resource_controller.controller import app as app_module
    from resource_controller.controller import serve
    from resource_controller.controller.deps import Settings
    from resource_controller.store.jobs import NewJob

    tokens = "wtok:worker,ctok:client,atok:admin"
    data = Path(tempfile.mkdtemp(prefix="rc-dispatch-")) / "data"
    svc = serve.open_services(data, tokens, Settings(), FakeClock(1_800_000_000.0))
    store: Any = svc.store
    if hasattr(store, "queue"):  # the store by aggregate
        store.devices.register("h", "boot", [("d0", 0)])
        job = store.queue.enqueue(NewJob(command=["true"], submitter="a"))
        store.queue.run_pass()
        wid = store.views.job(job.id).worker_id
    else:  # trees before it (dfc1614 and older)
        store.register("h", "boot", [("d0", 0)])
        job = store.enqueue(NewJob(command=["true"], submitter="a"))
        store.schedule()
        wid = store.job(job.id).worker_id
    app: Any = app_module.create_app(svc, run_loops=False)
    if hasattr(app_module, "wrap"):  # trees before the route table (dfc1614 and older)
        app = app_module.wrap(app, svc)
    beat = json.dumps({"running_job_ids": [job.id]}).encode()
    running = json.dumps({"worker_id": wid, "state": "running"}).encode()
    cases = {
        "GET /v1/whoami": ("GET", "/v1/whoami", b"ctok", b""),
        "GET /v1/jobs/{id}": ("GET", f"/v1/jobs/{job.id}", b"ctok", b""),
        "POST heartbeat": ("POST", f"/v1/workers/{wid}/heartbeat", b"wtok", beat),
        "POST status running": ("POST", f"/v1/jobs/{job.id}/status", b"wtok", running),
        "GET /v1/state": ("GET", "/v1/state", b"ctok", b""),
        "POST kill, unknown job": ("POST", "/v1/jobs/nope/kill", b"ctok", b'{"submitter":"a"}'),
        "GET unknown path": ("GET", "/nope", b"ctok", b""),
    }

    async def call(method: str, path: str, token: bytes, body: bytes) -> None:
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": [
                (b"host", b"bench"),
                (b"authorization", b"Bearer " + token),
                (b"content-length", b"%d" % len(body)),
                (b"content-type", b"application/json"),
            ],
            "http_version": "1.1",
            "scheme": "http",
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 1),
            "root_path": "",
            "state": {},
        }

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await asyncio.sleep(3600)  # the client stays connected
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            pass

        await app(scope, receive, send)

    async def run() -> dict[str, float]:
        out = {}
        for name, args in cases.items():
            for _ in range(50):  # warm caches and the store's statements
                await call(*args)
            t0 = time.process_time()
            for _ in range(n):
                await call(*args)
            out[name] = (time.process_time() - t0) / n * 1e6
        return out

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--other-src", type=Path, help="another checkout's src, measured alike")
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.once:
        print(json.dumps(measure(args.requests)))
        return
    trees = {"this tree": os.environ.get("PYTHONPATH", "")}
    if args.other_src:
        trees[str(args.other_src)] = str(args.other_src)
    figures: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    for _ in range(args.rounds):
        for tree, path in trees.items():
            cmd = [sys.executable, __file__, "--once", "--requests", str(args.requests)]
            env = dict(os.environ, PYTHONPATH=path) if path else dict(os.environ)
            got = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True).stdout)
            for name, us in got.items():
                figures[tree].setdefault(name, []).append(us)
    for tree, by in figures.items():
        print(f"{tree}: CPU µs per request, median (min-max) of {args.rounds} rounds")
        for name, xs in by.items():
            print(f"  {name:<24}{statistics.median(xs):8.0f} ({min(xs):.0f}-{max(xs):.0f})")
    if args.other_src:
        this, other = figures.values()
        print("this tree / other, medians:")
        for name in this:
            ratio = statistics.median(this[name]) / statistics.median(other[name])
            print(f"  {name:<24}{ratio:8.2f}x")


if __name__ == "__main__":
    main()
