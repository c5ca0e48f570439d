"""A run's history and the checks that prove exclusivity and outcomes from it.

Two witnesses record who held each device when. The jobs themselves: each job the
harness submits takes ``flock -n`` on a per-device lock file and, while holding it,
appends ``start`` and ``end`` stamps (wall clock, device, job ID) to a per-device
record; a refused lock appends ``refused`` instead, which is an overlap caught in the
act. And the controller: every job's ``device_id``, ``started_at`` and ``finished_at``
as its job view reports them. The checker then asks, of both, that no two intervals on
one device overlap (touching is fine: one ends as the next begins), that every
submitted job reached exactly one terminal state, and that no idempotency key produced
two jobs.

The check functions are pure (histories in, violations out) so they are unit-tested
on hand-made histories; the recorder parts read files and HTTP and are used by the
reliability tests and by ``bench/`` (which puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import collections
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

TERMINAL = frozenset({"succeeded", "failed", "killed", "lost"})
#: The exit code a recorded job uses when its device's lock was already held.
REFUSED_EXIT = 99


@dataclass(frozen=True)
class Interval:
    """One job's hold of one device; ``end`` is ``None`` when no end was recorded."""

    device: str
    job_id: str
    start: float
    end: float | None
    source: str = "flock"


@dataclass(frozen=True)
class Refusal:
    """A job found its device's lock already held: two holders at once."""

    device: str
    job_id: str
    at: float


@dataclass(frozen=True)
class Submission:
    """A submit the client saw acknowledged: this key produced this job."""

    key: str
    job_id: str


@dataclass(frozen=True)
class Observation:
    """A job's state as read at some moment (a job view, a list entry, a final read)."""

    job_id: str
    state: str
    at: float = 0.0


@dataclass
class History:
    """Everything a run recorded; the checker reads nothing else."""

    submitted: list[Submission] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    intervals: list[Interval] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    #: Jobs as the controller lists them (ID, idempotency key), for duplicate checks.
    stored: list[tuple[str, str]] = field(default_factory=list)


# ---- checks (pure) ---------------------------------------------------------------------


def overlaps(intervals: Iterable[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals of one source on one device that share more than an instant,
    in either order (each ends after the other starts).

    Intervals are compared within their source (the flock stamps and the controller's
    whole-second records have different clocks and resolutions). A controller interval
    without an end (a job not finished when the run ended) lasts for ever. A flock
    interval without an end (a job killed before it could stamp one) ends at the next
    recorded start on its device: that start took the lock with ``flock -n``, which
    proves the lock was free then; had it not been, the job would have recorded a
    refusal instead.
    """
    found: list[tuple[Interval, Interval]] = []
    groups: dict[tuple[str, str], list[Interval]] = collections.defaultdict(list)
    for iv in intervals:
        groups[(iv.source, iv.device)].append(iv)
    for (source, _device), group in groups.items():
        group.sort(key=lambda iv: (iv.start, iv.job_id))
        # Sweep: every interval still open at the next start overlaps it.
        active: list[Interval] = []
        for iv in group:
            active = [
                a
                for a in active
                if (a.end is None and source != "flock") or (a.end is not None and a.end > iv.start)
            ]
            # Same start: the other order must be ruled out too. The controller's stamps
            # are whole seconds, so [5, 6] and [5, 5] may be a job that began and ended
            # within second 5 followed by one that began later in it: touching, not
            # overlapping (neither order is possible only if each ends after the other
            # starts).
            found.extend(
                (a, iv)
                for a in active
                if a.job_id != iv.job_id and (iv.end is None or iv.end > a.start)
            )
            active.append(iv)
    return found


def outside_lease(intervals: Iterable[Interval], slack: float = 1.0) -> list[Interval]:
    """Flock holds not inside the controller's record of the same job on the same device.

    A job's process must run only while the controller says the job holds the device:
    a hold that began before its hand-out or outlived its terminal record means the
    device was free in the controller's eyes while the job still used it. ``slack``
    covers the controller's whole-second timestamps (truncated, STORE-004).
    """
    ctl = {(iv.device, iv.job_id): iv for iv in intervals if iv.source == "controller"}
    bad: list[Interval] = []
    for iv in intervals:
        if iv.source != "flock":
            continue
        lease = ctl.get((iv.device, iv.job_id))
        if lease is None:
            bad.append(iv)
            continue
        early = iv.start < lease.start - slack
        late = lease.end is not None and (iv.end is None or iv.end > lease.end + slack)
        if early or late:
            bad.append(iv)
    return bad


def without_terminal_state(history: History) -> list[str]:
    """Submitted jobs never seen in a terminal state."""
    ended = {o.job_id for o in history.observations if o.state in TERMINAL}
    return sorted({s.job_id for s in history.submitted} - ended)


def several_terminal_states(history: History) -> dict[str, list[str]]:
    """Jobs seen in two different terminal states (a terminal state must be final)."""
    seen: dict[str, set[str]] = collections.defaultdict(set)
    for o in history.observations:
        if o.state in TERMINAL:
            seen[o.job_id].add(o.state)
    return {job: sorted(states) for job, states in seen.items() if len(states) > 1}


def left_terminal_state(history: History) -> list[str]:
    """Jobs seen non-terminal after having been seen terminal (time-ordered reads)."""
    ended_at: dict[str, float] = {}
    bad: set[str] = set()
    for o in sorted(history.observations, key=lambda o: o.at):
        if o.state in TERMINAL:
            ended_at.setdefault(o.job_id, o.at)
        elif o.job_id in ended_at and o.at > ended_at[o.job_id]:
            bad.add(o.job_id)
    return sorted(bad)


def duplicates(history: History) -> dict[str, list[str]]:
    """Idempotency keys that produced more than one job, acknowledged or stored."""
    jobs: dict[str, set[str]] = collections.defaultdict(set)
    for s in history.submitted:
        if s.key:
            jobs[s.key].add(s.job_id)
    for job_id, key in history.stored:
        if key:
            jobs[key].add(job_id)
    return {key: sorted(ids) for key, ids in jobs.items() if len(ids) > 1}


@dataclass
class Verdict:
    """What the checker found; ``ok`` only when every list is empty."""

    overlaps: list[tuple[Interval, Interval]]
    refusals: list[Refusal]
    without_terminal_state: list[str]
    several_terminal_states: dict[str, list[str]]
    left_terminal_state: list[str]
    duplicates: dict[str, list[str]]
    unfinished_intervals: int
    #: Flock holds outside the controller's record; only checked when asked (``check``).
    outside_lease: list[Interval] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.overlaps
            or self.refusals
            or self.without_terminal_state
            or self.several_terminal_states
            or self.left_terminal_state
            or self.duplicates
            or self.outside_lease
        )

    def figures(self) -> dict[str, int]:
        """Counts, for reports and ``bench/README.md``."""
        return {
            "exclusivity_violations": len(self.overlaps) + len(self.refusals),
            "overlapping_intervals": len(self.overlaps),
            "lock_refusals": len(self.refusals),
            "without_terminal_state": len(self.without_terminal_state),
            "several_terminal_states": len(self.several_terminal_states),
            "left_terminal_state": len(self.left_terminal_state),
            "duplicate_jobs": sum(len(v) - 1 for v in self.duplicates.values()),
            "unfinished_intervals": self.unfinished_intervals,
            "held_outside_lease": len(self.outside_lease),
        }


def check(history: History, leases: bool = False) -> Verdict:
    """Every check over one history; ``leases`` adds ``outside_lease`` (it needs the
    controller's final record of every flock-recorded job)."""
    return Verdict(
        overlaps=overlaps(history.intervals),
        refusals=list(history.refusals),
        without_terminal_state=without_terminal_state(history),
        several_terminal_states=several_terminal_states(history),
        left_terminal_state=left_terminal_state(history),
        duplicates=duplicates(history),
        unfinished_intervals=sum(1 for iv in history.intervals if iv.end is None),
        outside_lease=outside_lease(history.intervals) if leases else [],
    )


# ---- recording: the jobs' own flock records ------------------------------------------


class FlockRecorder:
    """Builds job commands that stamp their hold of the device, and reads the stamps.

    Each line of ``<dir>/<device>.rec`` is ``start|end|refused <unix seconds> <device>
    <job>``; lines are single short ``O_APPEND`` writes, so concurrent writers never
    interleave within a line. The lock file is ``<dir>/<device>.lock``.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def command(self, work: str = "true", exit_code: int = 0) -> list[str]:
        """``sh -c`` taking the device's lock with ``flock -n`` around ``work``.

        The job exits ``exit_code`` after ``work``, or ``REFUSED_EXIT`` (99) if the lock
        was held, having recorded the refusal.
        """
        d = shlex.quote(str(self.dir))
        stamp = 'echo "$1 $(date +%s.%N) $RC_DEVICE $RC_JOB_ID" >> ' + d + '/"$RC_DEVICE".rec'
        inner = f"st() {{ {stamp}; }}; st start; {work}; st end"
        script = (
            f"st() {{ {stamp}; }}; "
            f'flock -n -E {REFUSED_EXIT} {d}/"$RC_DEVICE".lock sh -c {shlex.quote(inner)}; '
            f'r=$?; if [ "$r" = {REFUSED_EXIT} ]; then st refused; exit {REFUSED_EXIT}; fi; '
            f"exit {exit_code}"
        )
        return ["sh", "-c", script]

    def read(self) -> tuple[list[Interval], list[Refusal]]:
        """Every hold (a start with its job's end, if any) and every refusal."""
        return parse_records(
            line
            for path in sorted(self.dir.glob("*.rec"))
            for line in path.read_text().splitlines()
        )


def parse_records(lines: Iterable[str]) -> tuple[list[Interval], list[Refusal]]:
    """Intervals and refusals from ``FlockRecorder`` lines; malformed lines are an error."""
    starts: dict[tuple[str, str], float] = {}
    ends: dict[tuple[str, str], float] = {}
    refusals: list[Refusal] = []
    for line in lines:
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 4 or parts[0] not in ("start", "end", "refused"):
            raise ValueError(f"malformed flock record line {line!r}")
        what, at, device, job = parts[0], float(parts[1]), parts[2], parts[3]
        if what == "refused":
            refusals.append(Refusal(device, job, at))
        elif what == "start":
            starts[(device, job)] = at
        else:
            ends[(device, job)] = at
    intervals = [
        Interval(device, job, at, ends.get((device, job))) for (device, job), at in starts.items()
    ]
    return intervals, refusals


# ---- recording: the controller's records ----------------------------------------------


def parse_ts(text: str | None) -> float | None:
    """The API's ``YYYY-MM-DDTHH:MM:SSZ`` as Unix seconds; ``None`` stays ``None``."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def controller_interval(job: Mapping[str, Any]) -> Interval | None:
    """A job's hold as the controller recorded it (hand-out to terminal), if it started."""
    start = parse_ts(job.get("started_at"))
    if start is None or not job.get("device_id"):
        return None
    end = parse_ts(job.get("finished_at"))
    if end is None and job.get("state") in TERMINAL:
        end = start
    return Interval(str(job["device_id"]), str(job["id"]), start, end, source="controller")


def add_controller_jobs(history: History, jobs: Iterable[Mapping[str, Any]], at: float) -> None:
    """Fold job records (from job views or ``/v1/jobs``) read at ``at`` into ``history``.

    A job's controller interval is the one from its latest record: an earlier read of a
    running job has no end yet, which a later read supplies.
    """
    jobs = list(jobs)
    fresh = {str(job["id"]) for job in jobs}
    history.intervals[:] = [
        iv for iv in history.intervals if iv.source != "controller" or iv.job_id not in fresh
    ]
    for job in jobs:
        history.observations.append(Observation(str(job["id"]), str(job["state"]), at))
        history.stored.append((str(job["id"]), str(job.get("idempotency_key") or "")))
        iv = controller_interval(job)
        if iv is not None:
            history.intervals.append(iv)
