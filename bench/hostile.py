"""A real ``rc serve`` under hostile input: its memory before, during and after (EXT-LIMITS).

Starts one controller on loopback, registers a worker with two devices, then sends,
in order:

* ``--fuzz`` rounds of schemathesis over ``/openapi.json`` with each role's token and
  none (schema-conforming and schema-violating requests from a fixed seed);
* 16 concurrent 64 MiB submits (``413 body_too_large`` expected, the rest unread);
* a submit whose lease deadline would overflow 64 bits, and a negative runtime
  (``400`` expected), followed by an ordinary job that must still be placed;
* an 8,000-digit selector on ``/v1/explain`` (time to answer);
* a 96 MiB log, then five concurrent snapshots of it while ``/v1/whoami`` is timed.

It prints one JSON object: the controller's resident memory at rest, its peak, and
after; the status codes seen; the fuzz totals. Usage: ``python bench/hostile.py
[--fuzz 12] [--seed 1] [--json out.json]``. Nothing is asserted: see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

RC = str(Path(sys.executable).parent / "rc")
TOKENS = {"worker": "wtok", "client": "ctok", "admin": "atok"}
MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peak(threading.Thread):
    """Samples a process's RSS every 20 ms and keeps the largest value."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.done = threading.Event()

    def rss(self) -> int:
        return int(self.proc.memory_info().rss)

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.rss())


def headers(role: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"} if role else {}


#: Endless streams: a fuzzed request would wait out its timeout (the test skips them too).
STREAMS = {"/v1/events", "/v1/jobs/{job_id}/tty/out", "/v1/jobs/{job_id}/tty/in"}


def fuzz(url: str, examples: int, seed: int) -> dict[str, Any]:
    """Schemathesis with every role and none; counts requests, 5xx and failed checks."""
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.core.result import Err

    doc = httpx.get(f"{url}/openapi.json", headers=headers("client")).json()
    schema = schemathesis.openapi.from_dict(doc)
    requests: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    for role in (*TOKENS, None):
        for result in schema.get_all_operations():
            if isinstance(result, Err):
                raise result.err()
            if result.ok().path in STREAMS:
                continue
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz_one(
                    result.ok(), mode, role, url, examples, seed, (requests, errors, failures)
                )
    return {"requests": dict(requests), "5xx": dict(errors), "failed_checks": dict(failures)}


def _fuzz_one(
    op: Any,
    mode: Any,
    role: str | None,
    url: str,
    examples: int,
    seed: int,
    counters: tuple[Counter[str], Counter[str], Counter[str]],
) -> None:
    """One operation in one generation mode under one role's token."""
    import hypothesis
    from hypothesis import HealthCheck, Phase
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error, response_schema_conformance
    from schemathesis.core.failures import Failure, FailureGroup

    requests, errors, failures = counters
    name = role or "none"

    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(op.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        kept = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
        case.headers = {**kept, **headers(role)}
        if case.path.endswith("/assignments"):
            case.query = {**(case.query or {}), "wait": "10ms"}
        response = case.call(base_url=url, timeout=10)
        requests[name] += 1
        # LOG-001 names one 500: a log append whose job ID cannot name a file.
        log_error = case.path.endswith("/logs") and case.method == "POST"
        if response.status_code >= 500 and not log_error:
            errors[name] += 1
        try:
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance]
            )
        except (Failure, FailureGroup):
            if not log_error:
                failures[name] += 1

    try:
        one()
    except hypothesis.errors.Unsatisfiable:
        # A route with no input and no security (GET /healthz, EXT-METRICS-3) has
        # nothing a schema-violating request could violate.
        if mode is not GenerationMode.NEGATIVE:
            raise


def big_submits(url: str) -> Counter[int]:
    body = b'{"command":["' + b"x" * (64 * MIB) + b'"]}'

    def send(_: int) -> int:
        r = httpx.post(
            f"{url}/v1/jobs",
            content=body,
            headers={**headers("client"), "Content-Type": "application/json"},
            timeout=60,
        )
        return r.status_code

    with ThreadPoolExecutor(16) as pool:
        return Counter(pool.map(send, range(16)))


def beat(url: str, worker_id: str) -> None:
    """A heartbeat, so the long fuzzing phase does not make the devices ``unknown``."""
    httpx.post(f"{url}/v1/workers/{worker_id}/heartbeat", json={}, headers=headers("worker"))


def poison_then_job(url: str, worker_id: str) -> dict[str, Any]:
    beat(url, worker_id)
    c = httpx.Client(base_url=url, headers=headers("client"), timeout=10)
    overflow = c.post(
        "/v1/jobs",
        json={
            "command": ["true"],
            "device_id": "hostile:gpu1",
            "submitter": "p",
            "max_runtime_seconds": 9223372036854775000,
        },
    )
    negative = c.post(
        "/v1/jobs",
        json={"command": ["true"], "device_id": "hostile:gpu1", "max_runtime_seconds": -1},
    )
    answer = c.post(
        "/v1/jobs", json={"command": ["true"], "device_id": "hostile:gpu0", "submitter": "bench"}
    )
    ok = answer.json()
    if "id" not in ok:
        return {"overflow": overflow.status_code, "negative": negative.status_code, "next": ok}
    time.sleep(0.3)
    state = c.get(f"/v1/jobs/{ok['id']}").json()["job"]["state"]
    return {"overflow": overflow.status_code, "negative": negative.status_code, "next": state}


def long_selector(url: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = httpx.get(
        f"{url}/v1/explain",
        params={"selector": "cpus>=" + "9" * 4000 + "x"},
        headers=headers("client"),
    )
    return {"status": r.status_code, "seconds": round(time.perf_counter() - t0, 4)}


def big_log(url: str, worker_id: str) -> dict[str, Any]:
    beat(url, worker_id)
    c = httpx.Client(base_url=url, timeout=30)
    job = c.post(
        "/v1/jobs",
        json={"command": ["sleep", "600"], "device_id": "hostile:gpu1", "submitter": "bench"},
        headers=headers("client"),
    ).json()["id"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = c.get(f"/v1/workers/{worker_id}/assignments?wait=1s", headers=headers("worker"))
        if r.status_code == 200 and any(a["job_id"] == job for a in r.json()["assignments"]):
            break
    chunk = b"y" * (MIB - 1) + b"\n"
    for _ in range(96):
        c.post(f"/v1/jobs/{job}/logs", content=chunk, headers=headers("worker"))

    def snapshot(_: int) -> int:
        n = 0
        with httpx.stream(
            "GET",
            f"{url}/v1/jobs/{job}/logs",
            params={"follow": "false"},
            headers=headers("client"),
            timeout=60,
        ) as r:
            for part in r.iter_bytes():
                n += len(part)
                time.sleep(0.001)  # a slow reader: the controller must not buffer for it
        return n

    whoami: list[float] = []
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(snapshot, i) for i in range(5)]
        while not all(f.done() for f in futures):
            t0 = time.perf_counter()
            httpx.get(f"{url}/v1/whoami", headers=headers("client"))
            whoami.append(time.perf_counter() - t0)
            time.sleep(0.05)
        sizes = [f.result() for f in futures]
    return {
        "log_bytes": sizes[0],
        "snapshots_complete": all(s == sizes[0] for s in sizes),
        "whoami_max_ms": round(max(whoami) * 1000, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fuzz", type=int, default=12, help="examples per operation, mode and role")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "RC_TOKENS": ",".join(f"{t}:{r}" for r, t in TOKENS.items())}
        proc = subprocess.Popen(
            [RC, "serve", "--addr", f"127.0.0.1:{port}", "--data", f"{tmp}/data"],
            env=env,
            stderr=open(f"{tmp}/serve.log", "wb"),  # noqa: SIM115 - closed with the process
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    httpx.get(f"{url}/openapi.json", timeout=1)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            worker = httpx.post(
                f"{url}/v1/workers/register",
                json={
                    "host": "hostile",
                    "boot_id": "b",
                    "devices": [{"name": "gpu0"}, {"name": "gpu1"}],
                },
                headers=headers("worker"),
            ).json()["worker_id"]
            peak = Peak(proc.pid)
            at_rest = peak.rss()
            peak.start()
            report: dict[str, Any] = {"rss_at_rest_mib": round(at_rest / MIB, 1)}
            report["fuzz"] = fuzz(url, args.fuzz, args.seed)
            report["rss_after_fuzz_mib"] = round(peak.rss() / MIB, 1)
            report["big_submits"] = dict(big_submits(url))
            report["poison"] = poison_then_job(url, worker)
            report["long_selector"] = long_selector(url)
            report["big_log"] = big_log(url, worker)
            peak.done.set()
            peak.join()
            report["rss_peak_mib"] = round(peak.peak / MIB, 1)
            report["rss_after_mib"] = round(peak.rss() / MIB, 1)
            report["controller_alive"] = proc.poll() is None
            report["controller_log_tail"] = Path(f"{tmp}/serve.log").read_text()[-2000:]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
