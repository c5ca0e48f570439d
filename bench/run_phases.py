"""Where ``rc run -d X -- true`` spends its time, phase by phase, against a live fleet.

Starts ``rc serve`` and ``rc worker`` (``latency.Fleet``), then, interleaved, times:
``python3 -c pass`` (the interpreter's start and exit), the whole ``rc run -d
benchbox:slot0 -- true``, and an instrumented child that does what ``rc run`` does
and reports each phase: the imports (``cli.main`` with the package, then ``rc run``'s
path: ``cli.run``, ``client.machine``), parsing the flags, and each request (submit; the log
follow, which lasts as long as the job takes to be assigned, started, run, reported
and committed; the final poll). Figures are min/median/max in ms over ``--repeats``.
Usage: ``python bench/run_phases.py [--repeats 20] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from latency import HOST, Fleet

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
PY = sys.executable
DEVICE = f"{HOST}:slot0"

#: The instrumented child: ``rc run``'s own steps, each timed with ``perf_counter``.
CHILD = f"""
import time
t0 = time.perf_counter()
from resource_controller.cli import main
t1 = time.perf_counter()
from resource_controller.cli import render, run as rc_run
from resource_controller.client import api, machine, transport
t2 = time.perf_counter()
values, command = rc_run.parse(["-d", {DEVICE!r}, "--", "true"])
wanted = rc_run.build(values, command)
client = api.JsonClient(submitter=None)
t3 = time.perf_counter()
marks = []
http = client._http
plain_request, plain_stream = http.request, http.stream

def request(call):
    s = time.perf_counter()
    try:
        return plain_request(call)
    finally:
        marks.append((call.method + " " + call.path.split("/")[-1], s, time.perf_counter()))

def stream(call):
    s = time.perf_counter()
    inner = plain_stream(call)
    plain_read = inner.read

    def read(idle=None):
        chunk = plain_read(idle)
        if chunk == b"":
            marks.append(("follow", s, time.perf_counter()))
        return chunk

    inner.read = read
    return inner

http.request, http.stream = request, stream
ran = client.drive(
    machine.run(
        wanted, client.submitter, client.monotonic, timeout=values["timeout"], sink=render.write_bytes
    ),
    say=render.say,
)
t4 = time.perf_counter()
import json, sys
out = {{"import cli.main (+ package)": t1 - t0, "import run path": t2 - t1,
       "parse + client": t3 - t2, "run total": t4 - t3}}
names = {{"POST jobs": "submit (POST)", "follow": "log follow (job runs)"}}
for name, s, e in marks:
    out[names.get(name, "final poll (GET)")] = e - s
sys.stderr.write(json.dumps(out) + "\\n")
sys.exit(ran.code)
"""


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def phases(env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(
        [PY, "-c", CHILD], env=env, check=True, capture_output=True, text=True, timeout=120
    )
    line = done.stderr.strip().splitlines()[-1]
    values: dict[str, float] = json.loads(line)
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp)) as fleet:
        env = dict(os.environ, RC_CONTROLLER=fleet.url, RC_TOKEN="ctok", RC_SUBMITTER="bench")
        env["RC_CONFIG"] = str(Path(tmp) / "absent-config.yaml")
        run_argv = [RC, "run", "-d", DEVICE, "--", "true"]
        timed(run_argv, env)  # warm the page cache and the controller
        for _ in range(args.repeats):
            samples.setdefault("python3 -c pass", []).append(timed([PY, "-c", "pass"], env))
            samples.setdefault("rc run -d X -- true (whole)", []).append(timed(run_argv, env))
            for name, value in phases(env).items():
                samples.setdefault(name, []).append(value)
    results = {}
    print(f"{'phase':34} {'min':>7} {'median':>7} {'max':>7}  (ms)")
    for label, xs in samples.items():
        row = {
            "min_ms": min(xs) * 1e3,
            "median_ms": statistics.median(xs) * 1e3,
            "max_ms": max(xs) * 1e3,
            "n": len(xs),
        }
        results[label] = row
        print(f"{label:34} {row['min_ms']:7.1f} {row['median_ms']:7.1f} {row['max_ms']:7.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
