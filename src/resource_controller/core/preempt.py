"""Preemption (EXT-PREEMPT-1, -4): which preemptible running jobs a blocked job stops, all on one
host, and which claims it may take over; a decision of the pass, so only a pass holding the pass
lock makes it, and a victim already chosen is never chosen again."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from resource_controller.core.scheduling import JobSnap

#: ``rc serve --preempt-min-runtime`` and ``--preempt-grace`` defaults, in seconds.
MIN_RUNTIME = 60
GRACE = 30


@dataclass(frozen=True)
class Settings:
    """``rc serve --preemption``, ``--preempt-min-runtime``."""

    on: bool = True
    min_runtime: int = MIN_RUNTIME


OFF = Settings(on=False)


@dataclass(frozen=True)
class Running:
    """A preemptible active job as the pass reads it."""

    id: str
    devices: tuple[str, ...]
    priority: int = 0
    started_at: int = 0  #: 0 while assigned and not yet started
    #: The job this attempt is being stopped for; '' when none.
    preempted_by: str = ""
    worker_id: str = ""
    hold: bool = False


def outranks(job: JobSnap, priority: int, preemptible: bool) -> bool:
    """``job`` may stop, or take the claim of, a job of ``priority`` that is ``preemptible``."""
    return preemptible and (not job.preemptible or job.priority > priority)


def grace(own: int, default: int) -> int:
    """A victim's grace: its submit's ``--preempt-grace`` may shorten the controller's."""
    return min(own, default) if own > 0 else default


@dataclass
class Preemption:
    """One pass's preemption: the running snapshot and the promised devices read when first
    needed (the store reads them only when something waits)."""

    running: Callable[[], Sequence[Running]]
    #: Device -> the non-preemptible queued job the last pass reserved it for.
    promised: Callable[[], Mapping[str, str]]
    now: int
    min_runtime: int = MIN_RUNTIME
    #: Victims chosen in this pass -> the job they make room for.
    chosen: dict[str, str] = field(default_factory=dict)
    #: (priority, preemptible) of the jobs that claimed in this pass.
    ranks: dict[str, tuple[int, bool]] = field(default_factory=dict)
    _by_device: dict[str, Running] | None = None
    _promised: Mapping[str, str] | None = None
    _lowest: int = 0  #: the lowest priority running: no preemptible job at or under it preempts

    def stoppable(self) -> bool:
        """Some preemptible job runs: a job submitted behind a settled queue may still preempt."""
        return bool(self._devices())

    def _devices(self) -> dict[str, Running]:
        if self._by_device is None:
            running = self.running()
            self._by_device = {d: r for r in running for d in r.devices}
            self._lowest = min((r.priority for r in running), default=0)
        return self._by_device

    def worker(self, job_id: str) -> str:
        """The worker of a running job the snapshot read; '' when none."""
        return next((r.worker_id for r in self._devices().values() if r.id == job_id), "")

    def unpromised(self, job: JobSnap, available: list[str]) -> list[str]:
        """A preemptible job's devices less those promised to a job that would stop it."""
        if self._promised is None:
            self._promised = self.promised()
        promised = self._promised
        if not promised:
            return available
        return [d for d in available if promised.get(d, job.id) == job.id]

    def _eligible(self, r: Running, job: JobSnap) -> bool:
        return (
            not r.hold
            and not r.preempted_by
            and r.id not in self.chosen
            and self.now - self._start(r) >= self.min_runtime
            and outranks(job, r.priority, True)
        )

    def claim(
        self,
        job: JobSnap,
        candidates: Iterable[str],
        count: int,
        usable: Callable[[str], tuple[str, bool] | None],
    ) -> list[str] | None:
        """The devices ``job`` claims while victims stop, choosing new ones if it must; None when
        preemption cannot place it. ``usable(d)``: its host and whether it is free, or None
        (held out, or claimed by a job ``job`` does not outrank)."""
        by_device = self._devices()
        if not by_device or (job.preemptible and job.priority <= self._lowest):
            return None
        hosts: dict[str, tuple[list[str], list[str], dict[str, list[str]]]] = {}
        victims: dict[str, Running] = {}
        for d in candidates:
            seen = usable(d)
            if seen is None:
                continue
            host, is_free = seen
            free, coming, held = hosts.setdefault(host, ([], [], {}))
            r = by_device.get(d)
            if r is None:
                if is_free:
                    free.append(d)
            elif r.preempted_by == job.id or self.chosen.get(r.id) == job.id:
                coming.append(d)
            elif self._eligible(r, job):
                victims[r.id] = r
                held.setdefault(r.id, []).append(d)
        best: tuple[tuple[int, int, str], list[str], list[str]] | None = None
        for host, (free, coming, held) in hosts.items():
            have = free + coming
            if len(have) >= count:
                if coming:  # its victims are stopping: it waits for them, choosing no more
                    return sorted(have[:count])
                continue
            chosen: list[str] = []
            ranked = sorted(held, key=lambda v: (victims[v].priority, -self._start(victims[v]), v))
            for v in ranked:
                if len(have) >= count:
                    break
                chosen.append(v)
                have += held[v]
            if len(have) < count:
                continue
            worst = max(victims[v].priority for v in chosen)
            lost = sum(self.now - self._start(victims[v]) for v in chosen)
            cost = (worst, lost, host)
            if best is None or cost < best[0]:
                best = (cost, chosen, have[:count])
        if best is None:
            return None
        for v in best[1]:
            self.chosen[v] = job.id
        return sorted(best[2])

    def _start(self, r: Running) -> int:
        """When it started; one not yet started has lost nothing and is in its first seconds."""
        return r.started_at or self.now
