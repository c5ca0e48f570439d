"""Failover under load: three controllers on one PostgreSQL database, two workers, and
``--clients`` loops of real ``rc run`` while the leader is SIGKILLed every ``--every``
seconds for ``--minutes``, then PostgreSQL itself stopped for ``--outage`` seconds and
started again (EXT-PG-8, EXT-PG-9).

Each job appends its start and end (job ID, device, wall time) to one file and exits
with a code of the client's choosing, so the run is judged from three sides: what the
clients saw (each ``rc run`` must exit with its job's code, whatever failed over under
it), what ran (no job started twice, no two jobs on one device at once) and what the
database holds (every acknowledged job ended, no lease overlapping another on its
device). Takeovers are timed by polling ``/healthz``. Controllers and workers are never
restarted for the outage: they must recover on their own.

    .venv/bin/python bench/failover_load.py --minutes 10 --every 20 --outage 10 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from controllers import Controllers, _get, _wait
from latency import RC, summary

from support import pg

ANNOUNCE = re.compile(r"rc: job (\S+) on (\S+)")
#: How long one ``rc run`` may take before the run calls it hung: the client's own
#: bound on waiting for the end (FINAL_WAIT, 300 s) and then some.
RUN_BOUND = 420.0


class Clients:
    """``n`` loops of ``rc run``, each job a recorded short sleep with a chosen code."""

    def __init__(self, urls: list[str], runs: Path, n: int) -> None:
        self.urls, self.runs, self.n = urls, runs, n
        self.stop = threading.Event()
        self.results: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(k,)) for k in range(n)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(RUN_BOUND + 30)

    def _loop(self, k: int) -> None:
        rng = random.Random(k)
        urls = self.urls[k % len(self.urls) :] + self.urls[: k % len(self.urls)]
        env = dict(os.environ, RC_CONTROLLER=",".join(urls), RC_TOKEN="ctok")
        while not self.stop.is_set():
            code = rng.choice((0, 0, 0, 3, 9))
            lines = rng.randint(1, 40)
            script = (
                f'echo "start $RC_JOB_ID $RC_DEVICE $(date +%s.%N)" >> {self.runs};'
                f' i=0; while [ $i -lt {lines} ]; do echo "out $i of {lines}"; i=$((i+1)); done;'
                f" sleep 0.{rng.randint(1, 5)};"
                f' echo "end $RC_JOB_ID $RC_DEVICE $(date +%s.%N)" >> {self.runs}; exit {code}'
            )
            expected = "".join(f"out {i} of {lines}\n" for i in range(lines))
            began = time.monotonic()
            try:
                done = subprocess.run(
                    [RC, "run", "--", "sh", "-c", script],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=RUN_BOUND,
                )
                exit_code, err, got = done.returncode, done.stderr, done.stdout
            except subprocess.TimeoutExpired as exc:
                exit_code, err, got = -1, str(exc.stderr or "") + "\n(hung)", ""
            found = ANNOUNCE.search(err)
            with self._lock:
                self.results.append(
                    {
                        "want": code,
                        "exit": exit_code,
                        "job": found[1] if found else "",
                        # Output: what rc printed of what the job wrote (a job that
                        # never ran wrote nothing).
                        "bytes_expected": len(expected) if found else 0,
                        "bytes_missing": max(0, len(expected) - len(got)) if found else 0,
                        "output_intact": got == expected or not found,
                        "stderr": err,
                        "began": began,
                        "took": time.monotonic() - began,
                    }
                )


def _leads(urls: list[str]) -> Callable[[], bool]:
    return lambda: any((_get(u, "/healthz") or {}).get("leader") for u in urls)


def leader_kills(ctl: Controllers, every: float, until: float) -> list[float]:
    """SIGKILL the leader every ``every`` seconds until ``until``; each takeover's time."""
    takeovers: list[float] = []
    while time.monotonic() + every < until:
        time.sleep(every)
        old = ctl.leader()
        if old is None:
            continue
        victim = ctl.servers[old]
        assert victim is not None
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        others = [u for i, u in enumerate(ctl.urls) if i != old]
        takeovers.append(_wait(_leads(others), "the takeover", 15))
        ctl.start(old)
    return takeovers


def ran(runs: Path) -> tuple[dict[str, int], list[tuple[str, str, str]]]:
    """(starts by job, overlapping pairs on one device) from the jobs' own records."""
    starts: collections.Counter[str] = collections.Counter()
    begun: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for line in runs.read_text().splitlines() if runs.exists() else []:
        parts = line.split()
        if len(parts) != 4:
            continue
        kind, job, device, at = parts
        if kind == "start":
            starts[job] += 1
            begun[job] = float(at)
        elif job in begun:
            spans[device].append((begun[job], float(at), job))
    overlaps = []
    for device, intervals in spans.items():
        intervals.sort()
        for a, b in itertools.pairwise(intervals):
            if b[0] < a[1]:
                overlaps.append((device, a[2], b[2]))
    return dict(starts), overlaps


def database_side(url: str) -> dict[str, Any]:
    """Jobs by state and leases overlapping on one device, from the database."""
    with psycopg.connect(url, autocommit=True) as conn:
        states: dict[str, int] = dict(
            conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
        )
        leases = conn.execute(
            "SELECT device_id, acquired_at, coalesce(released_at, 9000000000000), job_id FROM leases"
            " ORDER BY device_id, epoch"
        ).fetchall()
        jobs: dict[str, str] = dict(conn.execute("SELECT id, state FROM jobs").fetchall())
    overlapping = []
    for _, group in itertools.groupby(leases, key=lambda r: r[0]):
        rows = list(group)
        for a, b in itertools.pairwise(rows):
            # In grant order (the epoch): each lease released before the next was granted,
            # in whole seconds (a hand-on within one second is not an overlap).
            if b[1] < a[2]:
                overlapping.append([list(a), list(b)])
    return {
        "states": states,
        "overlapping_leases": len(overlapping),
        "overlapping_samples": overlapping[:3],
        "jobs": jobs,
    }


def judge(clients: Clients, runs: Path, db: dict[str, Any]) -> dict[str, Any]:
    starts, overlaps = ran(runs)
    results = clients.results
    acked = [r for r in results if r["job"]]
    wrong = [r for r in results if r["exit"] != r["want"]]
    never_ended = [
        r["job"] for r in acked if db["jobs"].get(r["job"]) not in ("succeeded", "failed")
    ]
    noted = collections.Counter(
        line
        for r in results
        for line in r["stderr"].splitlines()
        if line and not ANNOUNCE.match(line) and "queued at position" not in line
    )
    return {
        "submitted": len(results),
        "acknowledged": len(acked),
        "finished_with_their_code": len(results) - len(wrong),
        "client_errors": len(wrong),
        "client_error_samples": [
            {k: r[k] for k in ("want", "exit", "job")} | {"stderr": r["stderr"][-400:]}
            for r in wrong[:5]
        ],
        "other_stderr_lines": dict(noted.most_common(8)),
        "acknowledged_not_ended": len(never_ended),
        "output_bytes_expected": sum(r["bytes_expected"] for r in results),
        "output_bytes_missing": sum(r["bytes_missing"] for r in results),
        "outputs_not_intact": sum(1 for r in results if not r["output_intact"]),
        "lost": db["states"].get("lost", 0),
        "run_twice": sum(1 for n in starts.values() if n > 1),
        "overlapping_runs": len(overlaps),
        "overlapping_leases": db["overlapping_leases"],
        "overlapping_lease_samples": db["overlapping_samples"],
        "jobs_by_state": db["states"],
        "rc_run_seconds": summary([r["took"] for r in results]) if results else {},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--every", type=float, default=20, help="seconds between leader kills")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--outage", type=float, default=10, help="PostgreSQL down this long; 0: none")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cluster = pg.start()
    tmp = Path(tempfile.mkdtemp(prefix="rc-failover-load-"))
    runs = tmp / "runs"
    out: dict[str, Any] = {}
    try:
        url = cluster.url(pg.TEMPLATE)
        with Controllers(tmp, 3, url) as ctl:
            clients = Clients(ctl.urls, runs, args.clients)
            clients.start()
            until = time.monotonic() + args.minutes * 60
            out["takeover_seconds"] = summary(leader_kills(ctl, args.every, until) or [0.0])
            if args.outage:
                cluster.down()
                time.sleep(args.outage)
                cluster.up()
                back = time.monotonic()
                _wait(
                    lambda: any((_get(u, "/healthz") or {}).get("leader") for u in ctl.urls),
                    "a leader after the outage",
                    60,
                )
                out["leader_after_outage_seconds"] = time.monotonic() - back
                time.sleep(30)  # the load goes on through the recovery
            clients.join()
            out |= judge(clients, runs, database_side(url))
            out["controllers_alive"] = sum(
                1 for s in ctl.servers if s is not None and s.poll() is None
            )
            out["workers_alive"] = sum(1 for w in ctl.workers if w.poll() is None)
    finally:
        cluster.stop()
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
