"""Why a queued job waits (EXT-WHY-1): one ``Blocker`` per candidate device, put in words by
``phrase``, ``summary`` and ``cell`` for controller and client alike."""

from __future__ import annotations

import calendar
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resource_controller.core import durations, scheduling, selectors, share
from resource_controller.core.scheduling import DeviceSnap, JobSnap, QueueKey, queue_key
from resource_controller.core.states import DeviceState, Kind

#: Device states that are out of the pool: only a proof or a person returns them.
OUT_OF_POOL = frozenset({DeviceState.UNKNOWN, DeviceState.UNHEALTHY})

#: How many devices a one-line summary names before "and N more".
SHOWN = 3


@dataclass(frozen=True)
class Holding:
    """A live lease as the why-rules read it, with what the store knows of its job."""

    device_id: str
    holder: str
    job_id: str = ""  #: '' for a job-less lease
    kind: str = Kind.JOB
    reason: str = ""  #: the hold's reason (copied to the lease at grant)
    acquired_at: int = 0
    expires_at: int = 0
    #: The holder's effective runtime (STORE-065 step 3; a hold's TTL); 0 none, None without a job.
    runtime: int | None = 0

    @property
    def until(self) -> int | None:
        """The latest time the holder can keep the device (EXT-WHY-1): the grant plus its runtime or
        TTL (``expires_at`` only for a job-less lease: heartbeats renew the rest)."""
        if self.runtime is None:
            return self.expires_at
        return self.acquired_at + self.runtime if self.runtime > 0 else None


@dataclass(frozen=True)
class Blocker:
    """One entry of ``waiting_for``; empty or None fields are omitted."""

    device_id: str = ""
    holder: str = ""
    job_id: str = ""
    kind: str = ""
    reason: str = ""
    since: int | None = None
    until: int | None = None
    reserved_by: str = ""
    state: str = ""
    quarantine_reason: str = ""
    draining: bool = False
    mig_conflict: str = ""  #: EXT-MIG-3
    #: The submitter's limit in devices, and the name it counts under.
    submitter_limit: int | None = None
    submitter: str = ""
    #: A job this one waits for that has not ended.
    after: str = ""
    #: EXT-PREEMPT-2: the jobs being stopped to make room for it.
    preempting: tuple[str, ...] = ()
    #: EXT-ARRAY-1: its array, whose tasks run at most this many at once and now do.
    array_id: str = ""
    array_limit: int | None = None

    @property
    def held(self) -> bool:
        return bool(self.holder) or self.since is not None


@dataclass(frozen=True)
class WaitFacts:
    """Everything the why-rules read, gathered once (one store transaction)."""

    devices: Sequence[DeviceSnap]
    queued: Sequence[JobSnap]
    leases: Sequence[Holding] = ()
    #: Device -> the job whose reservation row claims it (the last pass's).
    reservations: Mapping[str, str] = field(default_factory=dict)
    #: Device -> quarantine text (the detail, else the category), for unhealthy devices.
    quarantine: Mapping[str, str] = field(default_factory=dict)
    #: The submitter limits, and the devices each share name holds.
    limits: share.SubmitterLimits = share.NO_LIMITS
    held: Mapping[str, int] = field(default_factory=dict)
    #: Queued job -> the jobs it waits for that have not ended, in its order.
    after: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: Queued job -> the victims stopping to make room for it.
    preempting: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: Arrays with as many tasks running as their ``%N`` cap allows -> that cap.
    capped: Mapping[str, int] = field(default_factory=dict)


class _Rules:
    """The snapshot indexed once, so answering for every queued job stays linear."""

    def __init__(self, snap: WaitFacts, key: QueueKey) -> None:
        self.snap = snap
        self.key = key
        self.devices = {d.id: d for d in snap.devices}
        self.leases = {h.device_id: h for h in snap.leases}
        self.order = {j.id: key(j) for j in snap.queued}
        #: Entries built so far, by device and the reserver ahead ('' for none).
        self._built: dict[tuple[str, str], Blocker] = {}

    def candidates(self, job: JobSnap) -> list[str]:
        try:
            return sorted(scheduling.candidates(job, self.snap.devices))
        except selectors.SelectorError:
            return []  # a stored selector that no longer parses waits for nothing

    def blocker(self, mine: Any, device_id: str) -> Blocker:
        """The entry for ``device_id`` of a job at queue key ``mine``: the same for every job
        behind the same reservation, so built once (``/v1/state`` asks 160,000 times for 10,000
        tasks on 16 devices)."""
        reserver = self.snap.reservations.get(device_id, "")
        theirs = self.order.get(reserver) if reserver else None
        ahead = reserver if theirs is not None and theirs < mine else ""
        found = self._built.get((device_id, ahead))
        if found is None:
            found = self._built[device_id, ahead] = self._build(device_id, ahead)
        return found

    def _build(self, device_id: str, reserved_by: str) -> Blocker:
        facts: dict[str, Any] = {}
        lease = self.leases.get(device_id)
        if lease is not None:
            facts.update(
                holder=lease.holder,
                job_id=lease.job_id,
                kind=lease.kind,
                reason=lease.reason,
                since=lease.acquired_at,
                until=lease.until,
            )
        if reserved_by:
            facts["reserved_by"] = reserved_by
        device = self.devices.get(device_id)
        if device is not None and device.state in OUT_OF_POOL:
            reason = ""
            if device.state == DeviceState.UNHEALTHY:
                reason = self.snap.quarantine.get(device_id, "")
            facts.update(state=device.state, quarantine_reason=reason)
        if device is not None and device.draining:
            facts["draining"] = True
        if device is not None and device.mig_conflict:
            facts["mig_conflict"] = device.mig_conflict
        return Blocker(device_id, **facts)

    def for_job(self, job: JobSnap) -> list[Blocker]:
        pending = self.snap.after.get(job.id)
        if pending:
            return [Blocker(after=other) for other in pending]
        victims = self.snap.preempting.get(job.id)
        if victims:
            return [Blocker(preempting=tuple(victims))]
        cap = self.snap.capped.get(job.array_id) if job.array_id else None
        if cap is not None:
            return [Blocker(array_id=job.array_id, array_limit=cap)]
        limits = self.snap.limits
        if limits.on:
            limit = share.over_limit(limits, self.snap.held, job.share, job.count)
            if limit is not None:
                return [Blocker(submitter_limit=limit, submitter=job.share)]
        mine = self.key(job)
        return [self.blocker(mine, d) for d in self.candidates(job)]


def waiting_for(job: JobSnap, snap: WaitFacts, key: QueueKey = queue_key) -> list[Blocker]:
    """What queued ``job`` waits for, one entry per candidate device, by device ID."""
    return _Rules(snap, key).for_job(job)


def waiting_for_all(snap: WaitFacts, key: QueueKey = queue_key) -> dict[str, list[Blocker]]:
    """``waiting_for`` of every queued job in the snapshot, from one indexing of it."""
    rules = _Rules(snap, key)
    return {j.id: rules.for_job(j) for j in snap.queued}


def _instant(value: Any) -> int | None:
    """Unix seconds of an RFC 3339 ``...Z`` instant as the controller writes them."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


def from_wire(entry: Mapping[str, Any]) -> Blocker:
    """A ``waiting_for`` entry from the wire; unreadable values read as absent."""
    facts: dict[str, Any] = {}
    for f in dataclasses.fields(Blocker):
        value = entry.get(f.name)
        if f.name in ("since", "until"):
            facts[f.name] = _instant(value)
        elif f.name == "draining":
            facts[f.name] = value is True
        elif f.name == "preempting":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            facts[f.name] = tuple(value) if isinstance(value, list) and ok else ()
        elif f.name in ("submitter_limit", "array_limit"):
            whole = isinstance(value, int) and not isinstance(value, bool)
            facts[f.name] = value if whole else None
        else:
            facts[f.name] = value if isinstance(value, str) else ""
    return Blocker(**facts)


def blockers_from_wire(entries: Any) -> list[Blocker]:
    """Every readable entry of a ``waiting_for`` list; anything not a list reads as none."""
    if not isinstance(entries, list):
        return []
    return [from_wire(e) for e in entries if isinstance(e, dict)]


# ---- words ------------------------------------------------------------------------------


def short_id(job_id: str) -> str:
    """A job ID cut to 8 characters and an ellipsis: enough for ``rc kill``."""
    return job_id if len(job_id) <= 8 else job_id[:8] + "…"


def rfc3339(seconds: int) -> str:
    """CLI-063 without importing ``datetime``: UTC, second precision, ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _holder_text(b: Blocker, now: int) -> str:
    ref = f"job {short_id(b.job_id)}" if b.job_id else "no job"
    if b.kind == Kind.HOLD:
        ref += f', hold "{b.reason}"' if b.reason else ", hold"
    text = f"held by {b.holder} ({ref})"
    if b.since is not None:
        text += f" for {durations.compact(now - b.since)}"
    if b.until is not None:
        text += f", at most until {rfc3339(b.until)}"
    return text


def limit_text(limit: int, submitter: str) -> str:
    """EXT-SHARE-1's words for a submitter at its limit."""
    return f"at the limit of {limit} devices for {submitter}"


def array_text(limit: int, array_id: str) -> str:
    """EXT-ARRAY-1's words for a task its array's cap holds back."""
    return f"at the limit of {limit} tasks running at once for array {short_id(array_id)}"


def preempting_text(victims: Sequence[str]) -> str:
    """EXT-PREEMPT-2's words for a job whose victims are stopping."""
    return f"preempting job {', '.join(short_id(v) for v in victims)} (stopping to make room)"


def phrase(b: Blocker, now: int, *, with_device: bool = True) -> str:
    """One blocker in words (``held by alice (job 1b2c3d4e…) for 12m0s, at most until …``)."""
    if b.submitter_limit is not None:
        return limit_text(b.submitter_limit, b.submitter)
    if b.array_limit is not None:
        return array_text(b.array_limit, b.array_id)
    if b.after:
        return f"after job {short_id(b.after)}, not ended yet"
    if b.preempting:
        return preempting_text(b.preempting)
    parts: list[str] = []
    if b.held:
        parts.append(_holder_text(b, now))
    if b.reserved_by:
        lead = "then next in line is" if parts else "reserved by"
        parts.append(f"{lead} job {short_id(b.reserved_by)}, queued ahead")
    if b.state == DeviceState.UNHEALTHY:
        why = f" ({b.quarantine_reason})" if b.quarantine_reason else ""
        parts.append(
            f"out of the pool: unhealthy{why} — an operator must clear it (rc clear {b.device_id})"
        )
    elif b.state:
        parts.append(
            f"out of the pool: {b.state} (its worker went silent; it returns when the worker"
            " reports again)"
        )
    if b.draining:
        parts.append("draining (it takes no new work)")
    if b.mig_conflict:
        parts.append(f"not offered: MIG conflict ({b.mig_conflict})")
    if not parts:
        parts.append("free (the next scheduling pass places the job)")
    text = ", ".join(parts)
    return f"{b.device_id} {text}" if with_device and b.device_id else text


def summary(blockers: Sequence[Blocker], now: int, *, pinned: bool) -> str:
    """All blockers in one line, devices separated by ``; ``; a pinned job's single
    device is not repeated. At most ``SHOWN`` devices are named, then how many more."""
    if not blockers:
        return "no device it could run on exists"
    if pinned and len(blockers) == 1:
        return phrase(blockers[0], now, with_device=False)
    if blockers[0].after:  # The jobs it waits for, in one clause
        ids = [short_id(b.after) for b in blockers[:SHOWN]]
        more = f" and {len(blockers) - SHOWN} more" if len(blockers) > SHOWN else ""
        return f"after job {', '.join(ids)}{more}, not ended yet"
    shown = [phrase(b, now) for b in blockers[:SHOWN]]
    if len(blockers) > SHOWN:
        shown.append(f"and {len(blockers) - SHOWN} more")
    return "; ".join(shown)


def cell(blockers: Sequence[Blocker], *, pinned: bool) -> str:
    """A short ``rc ps`` cell: who or what keeps each device."""

    if blockers and blockers[0].submitter_limit is not None:  # EXT-SHARE-1
        b = blockers[0]
        return f"submitter_limit: {limit_text(b.submitter_limit or 0, b.submitter)}"
    if blockers and blockers[0].preempting:
        return preempting_text(blockers[0].preempting)
    if blockers and blockers[0].array_limit is not None:
        return array_text(blockers[0].array_limit, blockers[0].array_id)
    if blockers and blockers[0].after:  # EXT-SHARE-2
        ids = [short_id(b.after) for b in blockers[:2]]
        more = f" +{len(blockers) - 2} more" if len(blockers) > 2 else ""
        return f"after {', '.join(ids)}{more}"

    def one(b: Blocker) -> str:
        bits: list[str] = []
        if b.held:
            if b.kind == Kind.HOLD:
                what = f'hold "{b.reason}"' if b.reason else "hold"
            else:
                what = f"job {short_id(b.job_id)}" if b.job_id else "no job"
            bits.append(f"{b.holder} ({what})")
        if b.reserved_by:
            bits.append(f"reserved by {short_id(b.reserved_by)}")
        if b.state:
            bits.append(f"{b.state}: {b.quarantine_reason}" if b.quarantine_reason else b.state)
        if b.draining:
            bits.append("draining")
        if b.mig_conflict:
            bits.append("mig conflict")
        return ", ".join(bits) or "free"

    if not blockers:
        return "no device"
    if pinned and len(blockers) == 1:
        return one(blockers[0])
    shown = [f"{b.device_id} {one(b)}" for b in blockers[:2]]
    if len(blockers) > 2:
        shown.append(f"+{len(blockers) - 2} more")
    return "; ".join(shown)
