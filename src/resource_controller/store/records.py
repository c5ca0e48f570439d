"""Typed rows: named tuples for rows read by the thousand (fast ``_make``), dataclasses else."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from resource_controller.core import mig
from resource_controller.core.scheduling import DeviceSnap, JobSnap
from resource_controller.core.states import ACTIVE, TERMINAL, JobState


class JobRecord(NamedTuple):
    id: str
    seq: int
    selector: str
    command: list[str]
    cwd: str
    env: dict[str, str]
    submitter: str
    idempotency_key: str | None
    state: str
    device_id: str
    worker_id: str
    exit_code: int | None
    kill_reason: str
    submitted_at: int
    started_at: int | None
    finished_at: int | None
    priority: int
    max_runtime_seconds: int
    idle_timeout: int
    queued_at: int
    kill_requested: int
    kill_delivered_at: int
    kind: str
    reason: str
    stdio: str
    device_count: int = 1
    #: 1 once the retention pass deleted the job's stored output.
    logs_pruned: int = 0
    #: A several-device job's devices by ID; () for a one-device job.
    device_ids: tuple[str, ...] = ()
    #: The name its submitter limit counts it under; '' on old rows.
    share_name: str = ""
    #: The jobs it waits for; any end will do (1) or only ``succeeded`` (0); how many still open.
    after_ids: tuple[str, ...] = ()
    after_any: int = 0
    after_open: int = 0
    #: What the worker measured of its GPUs; None when nothing was sampled.
    gpu_util_mean: float | None = None
    gpu_mem_peak_bytes: int | None = None
    gpu_samples: int | None = None
    #: Migration 0014: the attempt (1 first), retries allowed and on what (EXT-RETRY-1), attempts
    #: preemption ended, the devices the latest attempt ended on, whether the submit named its
    #: devices.
    attempt: int = 1
    retries: int = 0
    retry_on: str = "lost"
    preemptions: int = 0
    avoid_device_ids: tuple[str, ...] = ()
    pinned: int = 0
    #: Its array ('' for none) and index in it (EXT-ARRAY-1).
    array_id: str = ""
    array_index: int | None = None
    #: EXT-PREEMPT: may be stopped to make room; ends instead of queueing again; its own grace
    #: (0: the controller's); the job its current attempt makes room for.
    preemptible: int = 0
    no_requeue: int = 0
    preempt_grace_seconds: int = 0
    preempted_by: str = ""
    #: Epoch of the job's newest lease, live or released; 0 when it never held one.
    lease_epoch: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def queued(self) -> bool:
        return self.state == JobState.QUEUED

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device the job is pinned to or was given, ascending; () when none yet."""
        if self.device_ids:
            return self.device_ids
        return (self.device_id,) if self.device_id else ()

    def snap(self) -> JobSnap:
        """What the scheduling rules read of this job (``core.scheduling``)."""
        return JobSnap(
            id=self.id,
            seq=self.seq,
            priority=self.priority,
            queued_at=self.queued_at,
            selector=self.selector,
            device_id=self.device_id,
            max_runtime_seconds=self.max_runtime_seconds,
            count=max(1, self.device_count),
            device_ids=self.device_ids if self.queued else (),
            share=self.share,
            after_open=self.after_open,
            avoid=self.avoid_device_ids,
            preemptible=bool(self.preemptible),
            array_id=self.array_id,
        )

    @property
    def share(self) -> str:
        """The name its submitter limit counts it under."""
        return self.share_name or self.submitter

    def columns(self) -> dict[str, Any]:
        """The row as the ``jobs`` table stores it."""
        m = self._asdict()
        del m["lease_epoch"]
        m["command"] = json.dumps(self.command)
        m["env"] = json.dumps(self.env) if self.env else None
        m["device_ids"] = join_ids(self.device_ids)
        m["after_ids"] = join_ids(self.after_ids)
        m["avoid_device_ids"] = join_ids(self.avoid_device_ids)
        return m


class AttemptRecord(NamedTuple):
    """An attempt that ended and sent its job back to the queue (``job_attempts``)."""

    job_id: str
    attempt: int
    device_ids: str
    worker_id: str
    started_at: int | None
    ended_at: int
    #: The job state it ended in, or ``preempted``.
    state: str
    exit_code: int | None
    kill_reason: str


def join_ids(ids: tuple[str, ...] | list[str]) -> str:
    """The stored form of a device list (``jobs.device_ids``): comma-separated, '' for ()."""
    return ",".join(ids)


def split_ids(text: str) -> tuple[str, ...]:
    return tuple(i for i in text.split(",") if i)


class DeviceRecord(NamedTuple):
    id: str
    host: str
    name: str
    worker_id: str
    state: str
    last_heartbeat_at: int
    max_runtime_seconds: int
    quarantine_reason: str
    quarantine_detail: str
    #: Finishes what it runs, takes nothing new; who, when (0: never) and why.
    draining: int = 0
    drained_by: str = ""
    drained_at: int = 0
    drain_reason: str = ""

    def snap(self, labels: dict[str, str] | None = None) -> DeviceSnap:
        """What the scheduling rules read of this device, with its effective labels."""
        return DeviceSnap(
            id=self.id,
            host=self.host,
            state=self.state,
            max_runtime_seconds=self.max_runtime_seconds,
            labels=labels or {},
            draining=bool(self.draining),
            mig_conflict=(labels or {}).get(mig.CONFLICT, ""),
        )


class LeaseRecord(NamedTuple):
    id: str
    device_id: str
    holder: str
    job_id: str
    acquired_at: int
    expires_at: int
    released_at: int | None
    kind: str
    reason: str
    epoch: int


class LabelRecord(NamedTuple):
    device_id: str
    key: str
    value: str
    source: str
    updated_at: int


class DeviceSnapshot(NamedTuple):
    """One device as the views need it: row, labels, and its live lease with the job behind it."""

    device: DeviceRecord
    labels: list[LabelRecord]
    lease: LeaseRecord | None
    command: list[str] | None


@dataclass(frozen=True)
class Registration:
    """What a registration did: the worker's ID and the jobs it reaped."""

    worker_id: str
    reboot_proof: bool
    reaped: list[str] = field(default_factory=list)
    #: The reaped jobs that queue again (EXT-RETRY-1) rather than end ``lost``.
    requeued: list[str] = field(default_factory=list)
    #: Undeclared devices a declared one now stands for: ID -> the declared names.
    superseded: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Assigned:
    job_id: str
    worker_id: str


class Preempted(NamedTuple):
    """A victim a pass chose (EXT-PREEMPT-1): its worker is woken to deliver the kill."""

    job_id: str
    worker_id: str
    by: str


class Kills(list[str]):
    """Due kill flags by job ID; ``grace``: those that stop a preemption's victim, with the
    victim's own ``preempt_grace_seconds`` (0: the controller's)."""

    def __init__(self, ids: Iterable[str] = (), grace: dict[str, int] | None = None) -> None:
        super().__init__(ids)
        self.grace = grace or {}


@dataclass(frozen=True)
class PassResult:
    """What one pass did: the jobs it placed and the waiting jobs it ended."""

    assigned: list[Assigned] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    #: Work handed out in the same commit, by worker: (jobs now ``running``, kills).
    handed: dict[str, tuple[list[JobRecord], list[str]]] = field(default_factory=dict)
    preempted: list[Preempted] = field(default_factory=list)


@dataclass(frozen=True)
class GpuUse:
    """What a terminal report says the job's GPUs did; None where nothing was measured."""

    util_mean: float | None = None
    mem_peak_bytes: int | None = None
    samples: int | None = None


NO_GPU_USE = GpuUse()


@dataclass(frozen=True)
class SweepResult:
    """What one sweep changed; an expired lease is named by its job's ID, or its own."""

    devices_unknown: list[str] = field(default_factory=list)
    devices_unhealthy: list[str] = field(default_factory=list)
    jobs_lost: list[str] = field(default_factory=list)
    leases_expired: list[str] = field(default_factory=list)
    #: Whether this pass was allowed to expire leases and write workers off.
    judging: bool = True
    #: Jobs whose attempt was lost and which queue again (EXT-RETRY-1).
    jobs_requeued: list[str] = field(default_factory=list)

    @property
    def alarming(self) -> bool:
        """Anything beyond mere ``unknown`` demotions (SRV-031: those are not worth a warning)."""
        return bool(
            self.devices_unhealthy or self.jobs_lost or self.leases_expired or self.jobs_requeued
        )


@dataclass(frozen=True)
class Recovered:
    """A device auto-recovery returned to the pool, and the reason it was quarantined for."""

    device_id: str
    reason: str


@dataclass(frozen=True)
class AutoRecovery:
    """Outcome of auto-recover: who came back, who the flap guard held back."""

    recovered: list[Recovered] = field(default_factory=list)
    #: Candidates skipped because they already recovered 3 times this hour.
    held_back: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RecoveryEntry:
    at: int
    reason: str


@dataclass(frozen=True)
class DeviceRecoveries:
    """One device's automatic recoveries inside the sliding window."""

    recoveries: list[RecoveryEntry]
    remaining: int
    limit: int
    window: int
