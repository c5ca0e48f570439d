"""Chaos: exclusivity and outcomes while the controller and workers are killed.

Phase 1 (``--seconds``, default 120): a controller and 4 workers with 2 devices each;
16 concurrent clients submit trivial jobs that take ``flock -n`` on a per-device file
(exit 99 if it is already held: two jobs on one device). Meanwhile the controller is
``kill -9``'d and restarted every 20 s and a random worker every 30 s, and every 45 s
the controller or a random worker is SIGSTOPped for 5 s. Clients retry
submits with the same idempotency key, so an outage never duplicates a job. After the
load stops, the fleet is given time to drain.

Phase 2 (EXT-OUTBOX-4): 50 jobs running on 4 workers, the controller down for 60 s
while they finish; every outcome must land with its real exit code and no device may
be quarantined. Phase 3 (``--webhook-seconds``): the webhook fault alone
(``bench/chaos_hooks.py``). The fleet and the client calls the phases share are
``bench/chaos_fleet.py``.

Each job stamps its hold of the device through ``support.history.FlockRecorder`` and
the run is judged by ``support.history.check`` (overlapping holds, lock refusals, jobs
without exactly one terminal state, duplicate jobs per idempotency key); processes are
killed through ``support.nemesis``.

Reports: jobs submitted, jobs per final state, exclusivity violations, exit-code
mismatches, jobs with no terminal state at the end, duplicate jobs, quarantined devices
and reasons.
With ``--postgresql`` every phase runs two controllers on one PostgreSQL database (a
throwaway cluster), workers listing both, and the controller nemesis kills the leader:
the other must take over, and the same judgement holds (EXT-PG-8, EXT-PG-9).

Usage (every flag: ``bench/README.md``): ``python bench/chaos.py [--jobs N] [--seconds 120]
[--outage 60] [--webhook slow|silent|dead|ok|none] [--postgresql] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos_fleet import (
    ADMIN_HEADERS,
    HEADERS,
    HOLD_OFF,
    HOOK_DEVICE,
    Fleet,
    final,
    freeze_for,
    get,
    isolation_works,
    job_processes,
    quarantined,
    submit,
    wait_for,
)
from chaos_hooks import HookWatch, phase_webhook

from support import history as hist
from support import pg, receiver


async def phase_one(
    fleet: Fleet,
    seconds: float | None,
    jobs: int | None,
    drain: float,
    hooks: HookWatch | None = None,
    controller_every: float = 20,
    worker_every: float = 30,
    freeze_every: float = 0,
    freeze_for_seconds: float = 5,
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
    freezes: list[tuple[float, str]] = []  #: (wall time, "controller" or the host)
    worker_exits: list[tuple[float, str]] = []
    operator_clears: list[tuple[float, str]] = []
    #: host → when each of its kills left no job process behind (seen in /proc).
    worker_gone: dict[str, list[float]] = collections.defaultdict(list)

    #: Submits the load's end cut short: each may have created a job whose answer was
    #: lost, which runs all the same; the drain retries them with the same key.
    unanswered: list[tuple[dict[str, object], str, int]] = []

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
                body: dict[str, object] = {"command": command, "submitter": f"chaos-{k}"}
                key = str(uuid.uuid4())
                got = await submit(c, body, load_until, key=key)
                if got is None:
                    unanswered.append((body, key, code))
                    return
                history.submitted.append(hist.Submission(*got))
                expected[got[1]] = code
                await final(c, got[1], load_until)

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
            if job_processes(dev["id"].split(":")[0], dev["id"]):
                continue
            with contextlib.suppress(httpx.HTTPError):
                r = await c.post(f"/v1/devices/{dev['id']}/clear", headers=ADMIN_HEADERS)
                if r.status_code == 200:
                    operator_clears.append((time.time(), dev["id"]))

    #: Hosts whose worker is being killed or restarted right now, by the monkey or the
    #: service manager: the other keeps off it, or two workers would run for one host
    #: (the first one's process lost track of, outliving the run).
    in_hand: set[str] = set()

    async def service_manager(until: asyncio.Event) -> None:
        """Restart a worker that exited on its own (a start-up registration that met a
        controller being killed is fatal, WRK-045), as a service manager would; its
        jobs died with it. It runs through the drain too: a worker left down then
        would never deliver its outbox, and its jobs would wait for the write-off."""
        while not until.is_set():
            await asyncio.sleep(0.5)
            for host, proc in list(fleet.workers.items()):
                if host in in_hand or proc is None or proc.poll() is None:
                    continue  # running, or the monkey's own kill and restart
                in_hand.add(host)
                try:
                    worker_exits.append((time.time(), host))
                    worker_gone[host].append(await asyncio.to_thread(fleet.kill_worker, host))
                    fleet.start_worker(host)
                finally:
                    in_hand.discard(host)

    async def chaos_monkey() -> None:
        # Intervals run from the moment the victim is back: on a loaded machine a
        # controller start-up can take a good part of 20 s, and counting from the kill
        # would leave it down most of the time.
        start = time.monotonic()
        next_ctl, next_wrk, next_op = start + controller_every, start + worker_every, start + 5
        next_frz = start + freeze_every if freeze_every > 0 else float("inf")
        async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
            while not done.is_set():
                await asyncio.sleep(0.5)
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
                    next_ctl = time.monotonic() + controller_every
                if time.monotonic() >= next_frz:
                    # SIGSTOP the controller or a worker for a while, at random: silence
                    # with every socket open. Shorter than the grace, it must cost nothing.
                    victim = rng.choice(["controller", *fleet.workers])
                    pid = (
                        fleet.controller.pid
                        if victim == "controller" and fleet.controller is not None
                        else fleet.worker_pid(victim)
                    )
                    if pid is not None:
                        freezes.append((time.time(), victim))
                        await freeze_for(pid, freeze_for_seconds)
                    next_frz = time.monotonic() + freeze_every
                if time.monotonic() >= next_wrk:
                    host = rng.choice([h for h in fleet.workers if h not in in_hand])
                    in_hand.add(host)
                    try:
                        worker_kills.append((time.time(), host))
                        gone = await asyncio.to_thread(fleet.kill_worker, host)
                        worker_gone[host].append(gone)
                        await asyncio.sleep(1)
                        fleet.start_worker(host)
                    finally:
                        in_hand.discard(host)
                    next_wrk = time.monotonic() + worker_every

    async def load() -> None:
        await asyncio.gather(*(client_loop(k) for k in range(16)))
        done.set()

    extra = [hooks.pump(done), hooks.sample(done)] if hooks else []
    drained = asyncio.Event()
    restarts = asyncio.create_task(service_manager(drained))
    await asyncio.gather(chaos_monkey(), load(), *extra)
    load_seconds = time.monotonic() - t0
    finals: dict[str, dict[str, object] | None] = {}
    async with httpx.AsyncClient(base_url=fleet.url, headers=HEADERS, timeout=10) as c:
        drain_until = time.monotonic() + drain
        for body, key, code in unanswered:
            got = await submit(c, body, drain_until, key=key)
            if got is not None:
                history.submitted.append(hist.Submission(*got))
                expected[got[1]] = code
        for sub in history.submitted:
            finals[sub.job_id] = await final(c, sub.job_id, drain_until)
    drained.set()
    await restarts
    hist.add_controller_jobs(history, [f for f in finals.values() if f], at=time.time())
    intervals, refusals = rec.read()
    ran = {iv.job_id for iv in intervals} | {r.job_id for r in refusals}
    cut = _hand_out_cut(finals, ran, [t for t, _ in ctl_kills])
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
        "answered_in_the_drain": len(unanswered),
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
        # Each with the controller's final record it was judged against.
        "outside_lease": [
            {**dataclasses.asdict(iv), "record": finals.get(iv.job_id)}
            for iv in verdict.outside_lease[:10]
        ],
        "controller_kills": len(ctl_kills),
        "freezes": {
            "controller": sum(1 for _, v in freezes if v == "controller"),
            "workers": sum(1 for _, v in freezes if v != "controller"),
            "seconds_each": freeze_for_seconds,
        },
        "worker_kills": len(worker_kills),
        "worker_exits_restarted": len(worker_exits),
        "operator_clears": len(operator_clears),
        "hold_off": _hold_off_figures(
            ctl_kills, outages, worker_kills + worker_exits, finals, expected, cut
        ),
        "lost": _lost_figures(finals, worker_kills + worker_exits, cut),
        "quarantined": quarantined(fleet),
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


def _hand_out_cut(
    finals: dict[str, dict[str, object] | None], ran: set[str], kills: list[float]
) -> set[str]:
    """``lost`` jobs that never ran (no flock record) and were handed out within 2 s of a
    controller kill: the poll's answer died with the controller after the hand-out had
    committed (STORE-080 moves a job to ``running`` before the answer is written, so a
    retried poll can never start it twice), and the worker's re-registration after the
    restart settles it as ``lost``. Nothing ran, so nothing was lost but the start."""
    cut = set()
    for job_id, f in finals.items():
        if not f or f["state"] != "lost" or job_id in ran:
            continue
        handed = hist.parse_ts(str(f.get("started_at") or "") or None)
        if handed is not None and any(handed - 2 <= t <= handed + 2 for t in kills):
            cut.add(job_id)
    return cut


def _hold_off_figures(
    ctl_kills: list[tuple[float, list[str]]],
    outages: list[float],
    worker_kills: list[tuple[float, str]],
    finals: dict[str, dict[str, object] | None],
    expected: dict[str, int],
    cut: set[str],
) -> dict[str, object]:
    """Jobs running when the controller was killed, the controller back within the
    hold-off: each must end with its real exit code, not ``lost``, unless its own
    worker was killed too (that loss is the worker kill's, not the restart's) or its
    hand-out's answer died with the kill (``_hand_out_cut``: it never ran)."""
    running = {j for _, ids in ctl_kills for j in ids}
    real = lost_worker = lost_hand_out = 0
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
        elif f["state"] == "lost" and job_id in cut:
            lost_hand_out += 1
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
        "lost_with_their_hand_out": lost_hand_out,
        "lost_to_the_restart": len(lost_restart),
        "lost_to_the_restart_ids": lost_restart[:20],
        "other": other[:20],
    }


def _lost_figures(
    finals: dict[str, dict[str, object] | None],
    worker_kills: list[tuple[float, str]],
    cut: set[str],
) -> dict[str, object]:
    """Every ``lost`` job of the run, split by what explains it: a kill of its worker,
    or a controller kill that cut its hand-out's answer (``_hand_out_cut``)."""
    lost = [f for f in finals.values() if f and f["state"] == "lost"]
    by_kill = [f for f in lost if _killed_during(f, worker_kills)]
    by_cut = [f for f in lost if f not in by_kill and str(f["id"]) in cut]
    unexplained = [str(f["id"]) for f in lost if f not in by_kill and f not in by_cut]
    return {
        "lost": len(lost),
        "explained_by_a_worker_kill": len(by_kill),
        "explained_by_a_cut_hand_out": len(by_cut),
        "unexplained": len(unexplained),
        "unexplained_ids": unexplained[:20],
        "kill_reasons": dict(collections.Counter(str(f.get("kill_reason", "")) for f in lost)),
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
        finals = {j: await final(c, j, until) for j in expected}
    await asyncio.sleep(35)  # past the restarted controller's hold-off: sweeps now judge
    recorded = sum(
        1
        for j, f in finals.items()
        if f and f["state"] in ("succeeded", "failed") and f.get("exit_code") == expected[j]
    )
    return {
        "jobs": jobs,
        "recorded_with_real_exit_code": recorded,
        "quarantined": quarantined(fleet),
    }


def _fleet(
    tmp: Path, devices: int, webhook_url: str = "", isolate: bool = True, database: str = ""
) -> Fleet:
    """On a PostgreSQL ``database``: two controllers, the nemesis killing the leader."""
    fleet = Fleet(
        tmp,
        workers=4,
        devices=devices,
        webhook_url=webhook_url,
        isolate=isolate,
        database=database,
        controllers=2 if database else 1,
    )
    fleet.tmp.mkdir()
    fleet.start_controller()
    for host in fleet.workers:
        fleet.start_worker(host)
    wait_for(lambda: len(get(fleet.url, "/v1/devices") or []) == 4 * devices, 30, "workers")
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
        "--controller-every", type=float, default=20, help="seconds between controller kills"
    )
    ap.add_argument("--worker-every", type=float, default=30, help="seconds between worker kills")
    ap.add_argument(
        "--freeze-every",
        type=float,
        default=45,
        help="seconds between SIGSTOPs of the controller or a random worker (0: none)",
    )
    ap.add_argument("--freeze-for", type=float, default=5, help="seconds each SIGSTOP lasts")
    ap.add_argument(
        "--no-isolate", action="store_true", help="run workers without a PID namespace each"
    )
    ap.add_argument(
        "--postgresql",
        action="store_true",
        help="two controllers on one PostgreSQL database (a throwaway cluster): the"
        " controller nemesis kills the leader (EXT-PG-8)",
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
    if args.controller_every <= 0 or args.worker_every <= 0:
        ap.error("--controller-every and --worker-every must be > 0")
    if args.freeze_every < 0 or args.freeze_for <= 0:
        ap.error("--freeze-every must be >= 0 and --freeze-for > 0")
    if args.pump_rate <= 0 or args.webhook_seconds < 0 or args.webhook_delay < 0:
        ap.error("--pump-rate must be > 0, --webhook-seconds and --webhook-delay >= 0")
    isolate = not args.no_isolate
    if isolate and not isolation_works():
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
        database: Callable[[], str] = str  # SQLite in each fleet's data directory
        if args.postgresql:
            cluster = pg.start()
            stack.callback(cluster.stop)
            database = cluster.fresh_database
        fleet = None
        try:
            if hook:
                hook.start()
            fleet = _fleet(Path(tmp) / "one", 2, hook.url if hook else "", isolate, database())
            watch = HookWatch(fleet, args.pump_rate) if hook else None
            results["chaos"] = asyncio.run(
                phase_one(
                    fleet,
                    args.seconds,
                    args.jobs,
                    drain=90,
                    hooks=watch,
                    controller_every=args.controller_every,
                    worker_every=args.worker_every,
                    freeze_every=args.freeze_every,
                    freeze_for_seconds=args.freeze_for,
                )
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
                fleet = _fleet(Path(tmp) / "two", 13, isolate=isolate, database=database())
                results["outage"] = asyncio.run(phase_two(fleet, args.outage))
            finally:
                if fleet:
                    fleet.stop()
            save()
        if args.webhook_seconds:
            dead = receiver.Receiver("dead").start()
            fleet = None
            try:
                fleet = _fleet(Path(tmp) / "three", 2, dead.url, isolate, database())
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
