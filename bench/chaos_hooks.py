"""The chaos run's webhook nemesis: a pump raising events at a receiver that is slow,
silent or dead, a sampler of the controller's webhook counters and memory, and the
phase that runs the fault alone (``bench/chaos.py`` phase 3)."""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos_fleet import HEADERS, HOOK_DEVICE, WORKER_HEADERS, Fleet, final, submit

from support import history as hist
from support import receiver


class HookWatch:
    """The webhook nemesis's two tasks: a pump that raises events (fault reports on the
    hookbox device) at ``rate`` per second, and a sampler that reads the controller's
    webhook counters (``/metrics``) and resident memory every second.

    Per controller life: events acknowledged, the largest backlog seen (acknowledged
    minus delivered minus dropped: what sits in the queue or is being tried; HOOKN-003
    bounds it at 256 queued + 1 in flight) and the largest RSS. The pump pauses while
    the sampler reads the counters (a few milliseconds a second), so no event is raised
    between the count of acknowledgements and the counters' own."""

    def __init__(self, fleet: Fleet, rate: float) -> None:
        self.fleet = fleet
        self.rate = rate
        self.acked: collections.Counter[int] = collections.Counter()
        self.lives: dict[int, dict[str, float]] = {}
        self.failed_posts = 0
        self._open = asyncio.Event()  #: clear while the sampler reads the counters
        self._open.set()
        self._idle = asyncio.Event()  #: set while no pump post is in flight
        self._idle.set()
        self._in_flight = 0

    async def pump(self, done: asyncio.Event, senders: int = 4) -> None:
        """``senders`` concurrent posters, each at ``rate / senders`` a second (one
        poster alone is held to the controller's answer time)."""
        async with httpx.AsyncClient(
            base_url=self.fleet.url, headers=WORKER_HEADERS, timeout=5
        ) as c:

            async def send(k: int) -> None:
                n = 0
                while not done.is_set():
                    await self._open.wait()
                    life = self.fleet.life
                    n += 1
                    self._in_flight += 1
                    self._idle.clear()
                    try:
                        r = await c.post(
                            f"/v1/devices/{HOOK_DEVICE}/fault", json={"reason": f"pump {k}.{n}"}
                        )
                        if r.status_code == 200 and life == self.fleet.life:
                            self.acked[life] += 1
                    except httpx.HTTPError:
                        self.failed_posts += 1
                    finally:
                        self._in_flight -= 1
                        if not self._in_flight:
                            self._idle.set()
                    await asyncio.sleep(senders / self.rate)

            await asyncio.gather(*(send(k) for k in range(senders)))

    async def sample(self, done: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.fleet.url, headers=HEADERS, timeout=5) as c:
            while not done.is_set():
                await asyncio.sleep(1)
                life, proc = self.fleet.life, self.fleet.controller
                # The pump is held while the counters are read, so every acknowledged
                # event is in them and none is raised meanwhile: the backlog is exact.
                self._open.clear()
                await self._idle.wait()
                acked = self.acked[life]
                try:
                    r = await c.get("/metrics")
                except httpx.HTTPError:
                    continue
                finally:
                    self._open.set()
                if r.status_code != 200 or life != self.fleet.life or proc is None:
                    continue
                counts = receiver.webhook_counts(r.text)
                dropped = sum(v for k, v in counts.items() if k.startswith("dropped_"))
                row = self.lives.setdefault(life, {"max_backlog": 0, "max_rss_kib": 0})
                backlog = acked - counts["delivered"] - dropped
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
                got = await submit(
                    c, {"command": rec.command("true"), "submitter": f"hook-{k}"}, until
                )
                if got is None:
                    return
                f = await final(c, got[1], until + 30)
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
