"""Chaos: exclusivity and outcomes while the controller and workers are killed.

Phase 1 (``--seconds``, default 120): a controller and 4 workers with 2 devices each;
16 concurrent clients submit trivial jobs that take ``flock -n`` on a per-device file
(exit 99 if it is already held: two jobs on one device). Meanwhile the controller is
``kill -9``'d and restarted every 20 s and a random worker every 30 s. Clients retry
submits with the same idempotency key, so an outage never duplicates a job. After the
load stops, the fleet is given time to drain.

Phase 2 (EXT-OUTBOX-4): 50 jobs running on 4 workers, the controller down for 60 s
while they finish; every outcome must land with its real exit code and no device may
be quarantined.

Each job stamps its hold of the device through ``support.history.FlockRecorder`` and
the run is judged by ``support.history.check`` (overlapping holds, lock refusals, jobs
without exactly one terminal state, duplicate jobs per idempotency key); processes are
killed through ``support.nemesis``.

Reports: jobs submitted, jobs per final state, exclusivity violations, exit-code
mismatches, jobs with no terminal state at the end, duplicate jobs, quarantined devices
and reasons.
Usage: ``python bench/chaos.py [--seconds 120] [--outage 60] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import history as hist
from support import receiver
from support.nemesis import kill_hard

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
TERMINAL = hist.TERMINAL
HEADERS = {"Authorization": "Bearer ctok"}
WORKER_HEADERS = {"Authorization": "Bearer wtok"}
ADMIN_HEADERS = {"Authorization": "Bearer atok"}
HOOK_DEVICE = "hookbox:gpu0"
#: Each worker in its own PID namespace, as PID 1 with its own ``/proc``: like a host of
#: its own, its jobs die with it and a restarted worker can prove it (the "isolated"
#: recovery proof, WRK-141). Without it the four "hosts" share one ``/proc``, every
#: restarted worker sees the others' jobs and proves nothing, and the devices of every
#: killed worker stay quarantined until the run starves. ``--kill-child``: ``kill -9`` of
#: ``unshare`` takes the namespace with it.
ISOLATE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
#: The controller's start-up hold-off (SRV-032): a restart shorter than this must not
#: cost a running job its real outcome.
HOLD_OFF = 30.0


class Fleet:
    """A controller and N workers, each restartable, all stopped by PID at the end."""

    def __init__(
        self, tmp: Path, workers: int, devices: int, webhook_url: str = "", isolate: bool = True
    ) -> None:
        self.tmp = tmp
        self.isolate = isolate
        self.webhook_url = webhook_url
        #: Controller processes started so far: the pump and the sampler count per life.
        self.life = 0
        self.hookbox: subprocess.Popen[bytes] | None = None
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.controller: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes] | None] = {
            f"chaos{i}": None for i in range(workers)
        }
        self.devices = devices

    def start_controller(self) -> None:
        env = dict(os.environ, RC_TOKENS="wtok:worker,ctok:client,atok:admin")
        hook = ["--webhook-url", self.webhook_url] if self.webhook_url else []
        self.life += 1  # before it answers: every answer from now on is this life's
        self.controller = subprocess.Popen(
            [
                RC,
                "serve",
                "--addr",
                f"127.0.0.1:{self.port}",
                "--data",
                str(self.tmp / "data"),
                *hook,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / "controller.log", "ab"),  # noqa: SIM115
        )
        _wait(lambda: _get(self.url, "/v1/state") is not None, 120, "controller")

    def kill_controller(self) -> None:
        if self.controller is not None:
            kill_hard(self.controller.pid)
            self.controller.wait(10)

    def start_worker(self, host: str) -> None:
        cfg = self.tmp / f"{host}.yaml"
        names = ", ".join(f"gpu{i}" for i in range(self.devices))
        cfg.write_text(
            f"controller_url: {self.url}\ntoken: wtok\nhost: {host}\n"
            f"state_dir: {self.tmp / ('state-' + host)}\ndevices: [{names}]\n"
        )
        self.workers[host] = subprocess.Popen(
            [*(ISOLATE if self.isolate else []), RC, "worker", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / f"{host}.log", "ab"),  # noqa: SIM115
        )

    def start_hookbox(self) -> None:
        """A fifth worker with one device that the webhook pump faults over and over
        (each fault report raises one ``device_unhealthy`` event, HOOKN-012a); it is
        faulted before any load, so it never takes a job, and never killed."""
        cfg = self.tmp / "hookbox.yaml"
        cfg.write_text(
            f"controller_url: {self.url}\ntoken: wtok\nhost: hookbox\n"
            f"state_dir: {self.tmp / 'state-hookbox'}\ndevices: [gpu0]\n"
        )
        self.hookbox = subprocess.Popen(
            [RC, "worker", "-c", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / "hookbox.log", "ab"),  # noqa: SIM115
        )
        _wait(
            lambda: any(
                v["device"]["id"] == HOOK_DEVICE for v in _get(self.url, "/v1/devices") or []
            ),
            30,
            "hookbox",
        )
        r = httpx.post(
            f"{self.url}/v1/devices/{HOOK_DEVICE}/fault",
            json={"reason": "webhook pump device"},
            headers=WORKER_HEADERS,
            timeout=10,
        )
        r.raise_for_status()

    def kill_worker(self, host: str) -> float:
        """``kill -9`` the worker; returns when none of its jobs' processes is left
        (with ``isolate`` they die with the namespace), as seen in ``/proc``."""
        proc = self.workers[host]
        if proc is not None:
            kill_hard(proc.pid)
            proc.wait(10)
        deadline = time.monotonic() + 30
        while _job_processes(host) and time.monotonic() < deadline:
            time.sleep(0.05)
        return time.time()

    def stop(self) -> None:
        procs = [*self.workers.values(), self.hookbox, self.controller]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            if proc is not None:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _job_processes(host: str, device: str = "") -> list[int]:
    """PIDs of live processes whose environment names a device of ``host`` (or, with
    ``device``, that device exactly)."""
    needle = (f"\0RC_DEVICE={device}\0" if device else f"\0RC_DEVICE={host}:").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env:
            found.append(int(entry.name))
    return found


def _isolation_works() -> bool:
    """Whether ``unshare`` can give a worker its own PID namespace here (root, Linux)."""
    try:
        done = subprocess.run([*ISOLATE, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, path: str) -> Any:
    try:
        r = httpx.get(url + path, headers=HEADERS, timeout=5)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def _wait(ok: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise SystemExit(f"{what} did not come up")


async def _submit(
    client: httpx.AsyncClient, body: dict[str, object], stop_at: float
) -> tuple[str, str] | None:
    """Submit with an idempotency key, retrying through outages; (key, job ID), or None
    if time ran out."""
    key = str(uuid.uuid4())
    body = {**body, "idempotency_key": key}
    while time.monotonic() < stop_at:
        try:
            r = await client.post("/v1/jobs", json=body)
            if r.status_code == 201:
                return key, str(r.json()["id"])
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    return None


async def _final(
    client: httpx.AsyncClient, job_id: str, stop_at: float
) -> dict[str, object] | None:
    """The job's terminal record, or ``None`` if it has none by ``stop_at``; read at
    least once even past it (a drain's deadline must not turn a finished job into one
    "without a terminal state")."""
    first = True
    while first or time.monotonic() < stop_at:
        first = False
        try:
            r = await client.get(f"/v1/jobs/{job_id}")
            if r.status_code == 200 and r.json()["job"]["state"] in TERMINAL:
                job: dict[str, object] = r.json()["job"]
                return job
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.3)
    return None


class HookWatch:
    """The webhook nemesis's two tasks: a pump that raises events (fault reports on the
    hookbox device) at ``rate`` per second, and a sampler that reads the controller's
    webhook counters (``/metrics``) and resident memory every second.

    Per controller life: events acknowledged, the largest backlog seen (acknowledged
    minus delivered minus dropped: what sits in the queue or is being tried; HOOKN-003
    bounds it at 256 queued + 1 in flight) and the largest RSS."""

    def __init__(self, fleet: Fleet, rate: float) -> None:
        self.fleet = fleet
        self.rate = rate
        self.acked: collections.Counter[int] = collections.Counter()
        self.lives: dict[int, dict[str, float]] = {}
        self.failed_posts = 0

    async def pump(self, done: asyncio.Event, senders: int = 4) -> None:
        """``senders`` concurrent posters, each at ``rate / senders`` a second (one
        poster alone is held to the controller's answer time)."""
        async with httpx.AsyncClient(
            base_url=self.fleet.url, headers=WORKER_HEADERS, timeout=5
        ) as c:

            async def send(k: int) -> None:
                n = 0
                while not done.is_set():
                    life = self.fleet.life
                    n += 1
                    try:
                        r = await c.post(
                            f"/v1/devices/{HOOK_DEVICE}/fault", json={"reason": f"pump {k}.{n}"}
                        )
                        if r.status_code == 200 and life == self.fleet.life:
                            self.acked[life] += 1
                    except httpx.HTTPError:
                        self.failed_posts += 1
                    await asyncio.sleep(senders / self.rate)

            await asyncio.gather(*(send(k) for k in range(senders)))

    async def sample(self, done: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.fleet.url, headers=HEADERS, timeout=5) as c:
            while not done.is_set():
                await asyncio.sleep(1)
                life, proc = self.fleet.life, self.fleet.controller
                try:
                    r = await c.get("/metrics")
                except httpx.HTTPError:
                    continue
                if r.status_code != 200 or life != self.fleet.life or proc is None:
                    continue
                counts = receiver.webhook_counts(r.text)
                dropped = sum(v for k, v in counts.items() if k.startswith("dropped_"))
                row = self.lives.setdefault(life, {"max_backlog": 0, "max_rss_kib": 0})
                backlog = self.acked[life] - counts["delivered"] - dropped
                row["max_backlog"] = max(row["max_backlog"], backlog)
                row["max_rss_kib"] = max(row["max_rss_kib"], receiver.rss_kib(proc.pid))
                row.update(counts)
                row["acked"] = self.acked[life]

    def figures(self) -> dict[str, object]:
        lives = list(self.lives.values())

        def total(key: str) -> float:
            return sum(v.get(key, 0.0) for v in lives)

        return {
            "lives_sampled": len(lives),
            "events_acked": sum(self.acked.values()),
            "delivered": total("delivered"),
            "dropped_queue_full": total("dropped_queue_full"),
            "dropped_failed": total("dropped_failed"),
            "max_backlog": max((v["max_backlog"] for v in lives), default=0),
            "max_rss_mib": round(max((v["max_rss_kib"] for v in lives), default=0) / 1024, 1),
            "pump_posts_failed": self.failed_posts,
        }


async def phase_one(
    fleet: Fleet,
    seconds: float | None,
    jobs: int | None,
    drain: float,
    hooks: HookWatch | None = None,
) -> dict[str, object]:
    rec = hist.FlockRecorder(fleet.tmp / "locks")
    history = hist.History()
    expected: dict[str, int] = {}
    t0 = time.monotonic()
    load_until = t0 + (seconds if seconds is not None else 6 * 3600)
    rng = random.Random(7)
    reserved = 0
    done = asyncio.Event()
    #: (wall time, job IDs running just before) for every controller kill, and how
    #: long each outage lasted (kill to answering again).
    ctl_kills: list[tuple[float, list[str]]] = []
    outages: list[float] = []
    worker_kills: list[tuple[float, str]] = []
    worker_exits: list[tuple[float, str]] = []
    operator_clears: list[tuple[float, str]] = []
    #: host → when each of its kills left no job process behind (seen in /proc).
    worker_gone: dict[str, list[float]] = collections.defaultdict(list)

    async def client_loop(k: int) -> None:
        nonlocal reserved
        async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
            while time.monotonic() < load_until:
                if jobs is not None:
                    if reserved >= jobs:
                        return
                    reserved += 1
                code = rng.randrange(0, 6)
                command = rec.command('sleep "0.$(( $$ % 5 ))"', exit_code=code)
                got = await _submit(c, {"command": command, "submitter": f"chaos-{k}"}, load_until)
                if got is None:
                    return
                history.submitted.append(hist.Submission(*got))
                expected[got[1]] = code
                await _final(c, got[1], load_until)

    async def running_now(c: httpx.AsyncClient) -> list[str]:
        try:
            r = await c.get("/v1/jobs?state=running&limit=200", timeout=3)
            return [str(j["id"]) for j in r.json()["jobs"]] if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError, KeyError):
            return []

    async def operator(c: httpx.AsyncClient) -> None:
        """Clear a device left quarantined at registration (past the flap guard's 3
        automatic recoveries an hour, STORE-122, which a worker killed every two
        minutes soon exceeds) once ``/proc`` shows no process carrying its
        ``RC_DEVICE``: the proof an operator would take before clearing it."""
        try:
            r = await c.get("/v1/devices", timeout=5)
            views = r.json() if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return
        for v in views:
            dev = v["device"]
            if dev["state"] != "unhealthy" or dev["id"] == HOOK_DEVICE:
                continue
            if v.get("quarantine_reason") != "registration":
                continue  # anything else is left for the report
            if _job_processes(dev["id"].split(":")[0], dev["id"]):
                continue
            with contextlib.suppress(httpx.HTTPError):
                r = await c.post(f"/v1/devices/{dev['id']}/clear", headers=ADMIN_HEADERS)
                if r.status_code == 200:
                    operator_clears.append((time.time(), dev["id"]))

    async def chaos_monkey() -> None:
        # Intervals run from the moment the victim is back: on a loaded machine a
        # controller start-up can take a good part of 20 s, and counting from the kill
        # would leave it down most of the time.
        start = time.monotonic()
        next_ctl, next_wrk, next_op = start + 20, start + 30, start + 5
        async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
            while not done.is_set():
                await asyncio.sleep(0.5)
                for host, proc in fleet.workers.items():
                    if proc is not None and proc.poll() is not None:
                        # It exited on its own (a start-up registration that met a
                        # controller being killed is fatal, WRK-045): restart it, as a
                        # service manager would; its jobs died with it.
                        worker_exits.append((time.time(), host))
                        worker_gone[host].append(await asyncio.to_thread(fleet.kill_worker, host))
                        fleet.start_worker(host)
                if time.monotonic() >= next_op:
                    next_op = time.monotonic() + 5
                    await operator(c)
                if time.monotonic() >= next_ctl:
                    running = await running_now(c)
                    killed_at = time.monotonic()
                    ctl_kills.append((time.time(), running))
                    fleet.kill_controller()
                    await asyncio.sleep(1)
                    await asyncio.to_thread(fleet.start_controller)
                    outages.append(time.monotonic() - killed_at)
                    next_ctl = time.monotonic() + 20
                if time.monotonic() >= next_wrk:
                    host = rng.choice(list(fleet.workers))
                    worker_kills.append((time.time(), host))
                    worker_gone[host].append(await asyncio.to_thread(fleet.kill_worker, host))
                    await asyncio.sleep(1)
                    fleet.start_worker(host)
                    next_wrk = time.monotonic() + 30

    async def load() -> None:
        await asyncio.gather(*(client_loop(k) for k in range(16)))
        done.set()

    extra = [hooks.pump(done), hooks.sample(done)] if hooks else []
    await asyncio.gather(chaos_monkey(), load(), *extra)
    load_seconds = time.monotonic() - t0
    finals: dict[str, dict[str, object] | None] = {}
    async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
        drain_until = time.monotonic() + drain
        for sub in history.submitted:
            finals[sub.job_id] = await _final(c, sub.job_id, drain_until)
    hist.add_controller_jobs(history, [f for f in finals.values() if f], at=time.time())
    intervals, refusals = rec.read()
    history.intervals += _ended_by_kills(intervals, worker_gone, fleet.isolate)
    history.refusals += refusals
    verdict = hist.check(history, leases=True)
    states = collections.Counter(
        (f or {}).get("state", "no terminal state") for f in finals.values()
    )
    mismatched = sum(
        1
        for job_id, f in finals.items()
        if f
        and f["state"] in ("succeeded", "failed")
        and f.get("exit_code") not in (expected[job_id], hist.REFUSED_EXIT)
    )
    figures = verdict.figures()
    result: dict[str, object] = {
        "submitted": len(history.submitted),
        "load_seconds": round(load_seconds),
        "states": dict(states),
        "violations": figures["exclusivity_violations"],
        "exit_code_mismatches": mismatched,
        "without_terminal_state": figures["without_terminal_state"],
        "duplicate_jobs": figures["duplicate_jobs"],
        "checker": figures,
        # The evidence of any violation, for the report (empty in a clean run).
        "overlaps": [
            [dataclasses.asdict(a), dataclasses.asdict(b)] for a, b in verdict.overlaps[:10]
        ],
        "refusals": [dataclasses.asdict(r) for r in verdict.refusals[:10]],
        "outside_lease": [dataclasses.asdict(iv) for iv in verdict.outside_lease[:10]],
        "controller_kills": len(ctl_kills),
        "worker_kills": len(worker_kills),
        "worker_exits_restarted": len(worker_exits),
        "operator_clears": len(operator_clears),
        "hold_off": _hold_off_figures(
            ctl_kills, outages, worker_kills + worker_exits, finals, expected
        ),
        "lost": _lost_figures(finals, worker_kills + worker_exits),
        "quarantined": _quarantined(fleet),
    }
    if hooks:
        result["webhook"] = hooks.figures()
    return result


def _ended_by_kills(
    intervals: list[hist.Interval], gone: dict[str, list[float]], isolate: bool
) -> list[hist.Interval]:
    """A job killed with its worker's namespace stamps no ``end``; its hold ended when
    ``/proc`` showed none of that host's job processes left (``Fleet.kill_worker``), the
    first such moment after its start. Without isolation nothing is closed."""
    if not isolate:
        return intervals
    out = []
    for iv in intervals:
        if iv.end is None:
            host = iv.device.split(":")[0]
            after = [t for t in gone.get(host, []) if t >= iv.start]
            if after:
                iv = dataclasses.replace(iv, end=min(after))
        out.append(iv)
    return out


def _killed_during(job: dict[str, object], worker_kills: list[tuple[float, str]]) -> bool:
    """Whether the job's worker was ``kill -9``'d while the job held its device (the
    controller's whole-second stamps, 2 s either side)."""
    host = str(job.get("device_id") or "").split(":")[0]
    start = hist.parse_ts(str(job.get("started_at") or "") or None)
    end = hist.parse_ts(str(job.get("finished_at") or "") or None) or time.time()
    if start is None:
        return any(h == host for _, h in worker_kills)
    return any(h == host and start - 2 <= t <= end + 2 for t, h in worker_kills)


def _hold_off_figures(
    ctl_kills: list[tuple[float, list[str]]],
    outages: list[float],
    worker_kills: list[tuple[float, str]],
    finals: dict[str, dict[str, object] | None],
    expected: dict[str, int],
) -> dict[str, object]:
    """Jobs running when the controller was killed, the controller back within the
    hold-off: each must end with its real exit code, not ``lost``, unless its own
    worker was killed too (that loss is the worker kill's, not the restart's)."""
    running = {j for _, ids in ctl_kills for j in ids}
    real = lost_worker = 0
    lost_restart: list[str] = []
    other: list[str] = []
    for job_id in sorted(running):
        f = finals.get(job_id)
        if f is None:
            other.append(f"{job_id}: no terminal state")
        elif f["state"] in ("succeeded", "failed") and f.get("exit_code") == expected.get(job_id):
            real += 1
        elif f["state"] == "lost" and _killed_during(f, worker_kills):
            lost_worker += 1
        elif f["state"] == "lost":
            lost_restart.append(job_id)
        else:
            other.append(f"{job_id}: {f['state']} exit {f.get('exit_code')}")
    return {
        "running_at_a_controller_kill": len(running),
        "outages_longer_than_hold_off": sum(o >= HOLD_OFF for o in outages),
        "outage_seconds_max": round(max(outages, default=0), 1),
        "outage_seconds_median": round(sorted(outages)[len(outages) // 2], 1) if outages else 0,
        "ended_with_real_exit_code": real,
        "lost_with_their_worker_killed": lost_worker,
        "lost_to_the_restart": len(lost_restart),
        "lost_to_the_restart_ids": lost_restart[:20],
        "other": other[:20],
    }


def _lost_figures(
    finals: dict[str, dict[str, object] | None], worker_kills: list[tuple[float, str]]
) -> dict[str, object]:
    """Every ``lost`` job of the run, split by whether a worker kill explains it."""
    lost = [f for f in finals.values() if f and f["state"] == "lost"]
    unexplained = [str(f["id"]) for f in lost if not _killed_during(f, worker_kills)]
    return {
        "lost": len(lost),
        "explained_by_a_worker_kill": len(lost) - len(unexplained),
        "unexplained": len(unexplained),
        "unexplained_ids": unexplained[:20],
        "kill_reasons": dict(collections.Counter(str(f.get("kill_reason", "")) for f in lost)),
    }


def _quarantined(fleet: Fleet) -> dict[str, str]:
    """Unhealthy devices and their reasons, the webhook pump's own device aside."""
    views = _get(fleet.url, "/v1/devices") or []
    return {
        v["device"]["id"]: v.get("quarantine_reason", "")
        for v in views
        if v["device"]["state"] == "unhealthy" and v["device"]["id"] != HOOK_DEVICE
    }


async def phase_webhook(fleet: Fleet, seconds: float, rate: float) -> dict[str, object]:
    """The webhook fault alone, no process killed: 16 clients run jobs for ``seconds``;
    the first third is the control, then the pump raises ``rate`` events a second at a
    receiver that never answers. Grants must go on at the control's pace, the backlog
    stay within the queue's 256 (+1 in flight) and the controller's memory level off."""
    rec = hist.FlockRecorder(fleet.tmp / "locks")
    t0 = time.monotonic()
    flood_at, until = t0 + seconds / 3, t0 + seconds
    done, flood = asyncio.Event(), asyncio.Event()
    hooks = HookWatch(fleet, rate)
    turnarounds: dict[str, list[float]] = {"control": [], "flood": []}
    failures = collections.Counter[str]()
    rss: list[tuple[float, int]] = []

    async def client_loop(k: int) -> None:
        async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
            while time.monotonic() < until:
                window = "flood" if flood.is_set() else "control"
                began = time.monotonic()
                got = await _submit(
                    c, {"command": rec.command("true"), "submitter": f"hook-{k}"}, until
                )
                if got is None:
                    return
                f = await _final(c, got[1], until + 30)
                if f is None or f["state"] != "succeeded":
                    failures[str((f or {}).get("state", "no terminal state"))] += 1
                else:
                    turnarounds[window].append(time.monotonic() - began)

    async def clock() -> None:
        await asyncio.sleep(max(0, flood_at - time.monotonic()))
        flood.set()
        pump = asyncio.create_task(hooks.pump(done))
        proc = fleet.controller
        while time.monotonic() < until:
            if proc is not None:
                rss.append((time.monotonic() - t0, receiver.rss_kib(proc.pid)))
            await asyncio.sleep(2)
        done.set()
        await pump

    await asyncio.gather(clock(), hooks.sample(done), *(client_loop(k) for k in range(16)))
    intervals, refusals = rec.read()
    verdict = hist.check(hist.History(intervals=intervals, refusals=refusals)).figures()

    def pct(xs: list[float], q: float) -> float:
        return round(sorted(xs)[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else 0.0

    half = len(rss) // 2
    return {
        "seconds": seconds,
        "pump_rate": rate,
        "jobs_control": len(turnarounds["control"]),
        "jobs_flood": len(turnarounds["flood"]),
        "jobs_per_s_control": round(len(turnarounds["control"]) / (seconds / 3), 2),
        "jobs_per_s_flood": round(len(turnarounds["flood"]) / (seconds * 2 / 3), 2),
        "turnaround_p50_control": pct(turnarounds["control"], 0.5),
        "turnaround_p50_flood": pct(turnarounds["flood"], 0.5),
        "turnaround_p95_control": pct(turnarounds["control"], 0.95),
        "turnaround_p95_flood": pct(turnarounds["flood"], 0.95),
        "jobs_not_succeeded": dict(failures),
        "exclusivity_violations": verdict["exclusivity_violations"],
        "rss_mib_flood_start": round(rss[0][1] / 1024, 1) if rss else 0,
        "rss_mib_mid": round(rss[half][1] / 1024, 1) if rss else 0,
        "rss_mib_end": round(rss[-1][1] / 1024, 1) if rss else 0,
        "webhook": hooks.figures(),
    }


async def phase_two(fleet: Fleet, outage: float, jobs: int = 50) -> dict[str, object]:
    rng = random.Random(11)
    expected: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
        for i in range(jobs):
            code = rng.randrange(0, 6)
            sleep = rng.uniform(3, outage - 10)
            r = await c.post(
                "/v1/jobs",
                json={
                    "command": ["sh", "-c", f"sleep {sleep:.1f}; exit {code}"],
                    "submitter": "outage",
                    "device_id": f"chaos{i % 4}:gpu{i // 4}",
                },
            )
            expected[r.json()["id"]] = code
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = await c.get("/v1/jobs?state=running&limit=200")
            if len(r.json()["jobs"]) == jobs:
                break
            await asyncio.sleep(0.2)
    fleet.kill_controller()
    await asyncio.sleep(outage)
    await asyncio.to_thread(fleet.start_controller)
    async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
        until = time.monotonic() + 120
        finals = {j: await _final(c, j, until) for j in expected}
    await asyncio.sleep(35)  # past the restarted controller's hold-off: sweeps now judge
    recorded = sum(
        1
        for j, f in finals.items()
        if f and f["state"] in ("succeeded", "failed") and f.get("exit_code") == expected[j]
    )
    return {
        "jobs": jobs,
        "recorded_with_real_exit_code": recorded,
        "quarantined": _quarantined(fleet),
    }


def _fleet(tmp: Path, devices: int, webhook_url: str = "", isolate: bool = True) -> Fleet:
    fleet = Fleet(tmp, workers=4, devices=devices, webhook_url=webhook_url, isolate=isolate)
    fleet.tmp.mkdir()
    fleet.start_controller()
    for host in fleet.workers:
        fleet.start_worker(host)
    _wait(lambda: len(_get(fleet.url, "/v1/devices") or []) == 4 * devices, 30, "workers")
    if webhook_url:
        fleet.start_hookbox()
    return fleet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, help="stop submitting after this long")
    ap.add_argument("--jobs", type=int, help="stop submitting after this many jobs")
    ap.add_argument("--outage", type=float, default=60)
    ap.add_argument(
        "--webhook",
        choices=[*receiver.RECEIVER_MODES, "none"],
        default="slow",
        help="the receiver phase 1's controller posts its events to",
    )
    ap.add_argument("--webhook-delay", type=float, default=30, help="a slow receiver's delay")
    ap.add_argument("--pump-rate", type=float, default=20, help="webhook events raised per s")
    ap.add_argument(
        "--webhook-seconds", type=float, default=120, help="phase 3's length (0: skip it)"
    )
    ap.add_argument("--skip-outage", action="store_true", help="skip phase 2")
    ap.add_argument(
        "--no-isolate", action="store_true", help="run workers without a PID namespace each"
    )
    ap.add_argument("--keep", type=Path, help="run in this new directory and keep it")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.seconds is None and args.jobs is None:
        args.seconds = 120.0
    if (args.seconds is not None and args.seconds <= 0) or (
        args.jobs is not None and args.jobs < 1
    ):
        ap.error("--seconds must be > 0 and --jobs at least 1")
    if args.pump_rate <= 0 or args.webhook_seconds < 0 or args.webhook_delay < 0:
        ap.error("--pump-rate must be > 0, --webhook-seconds and --webhook-delay >= 0")
    isolate = not args.no_isolate
    if isolate and not _isolation_works():
        ap.error("unshare cannot make a PID namespace here (not root?); use --no-isolate")
    results: dict[str, object] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    }

    def save() -> None:
        print(json.dumps(results, indent=2), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))

    with contextlib.ExitStack() as stack:
        if args.keep:  # kept for a post-mortem: logs, the store, the flock records
            args.keep.mkdir(parents=True, exist_ok=False)
            tmp = str(args.keep)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rc-chaos-"))
        hook = (
            None if args.webhook == "none" else receiver.Receiver(args.webhook, args.webhook_delay)
        )
        fleet = None
        try:
            if hook:
                hook.start()
            fleet = _fleet(Path(tmp) / "one", 2, hook.url if hook else "", isolate)
            watch = HookWatch(fleet, args.pump_rate) if hook else None
            results["chaos"] = asyncio.run(
                phase_one(fleet, args.seconds, args.jobs, drain=90, hooks=watch)
            )
            if hook:
                results["chaos_receiver"] = {"mode": hook.mode, "requests_read": len(hook.received)}
        finally:
            if fleet:
                fleet.stop()
            if hook:
                hook.stop()
        save()
        if not args.skip_outage:
            fleet = None
            try:
                fleet = _fleet(Path(tmp) / "two", 13, isolate=isolate)
                results["outage"] = asyncio.run(phase_two(fleet, args.outage))
            finally:
                if fleet:
                    fleet.stop()
            save()
        if args.webhook_seconds:
            dead = receiver.Receiver("dead").start()
            fleet = None
            try:
                fleet = _fleet(Path(tmp) / "three", 2, dead.url, isolate)
                results["webhook"] = asyncio.run(
                    phase_webhook(fleet, args.webhook_seconds, args.pump_rate)
                )
            finally:
                if fleet:
                    fleet.stop()
                dead.stop()
            save()


if __name__ == "__main__":
    main()
