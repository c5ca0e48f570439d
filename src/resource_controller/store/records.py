"""Typed rows the store hands out: frozen records, never live ORM objects."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from resource_controller.core.scheduling import DeviceSnap, JobSnap
from resource_controller.core.states import ACTIVE, TERMINAL, JobState

R = TypeVar("R")


def row_builder(cls: type[R]) -> Callable[[Sequence[Any]], R]:
    """A builder of ``cls`` from a row holding every field in declaration order, for
    the whole-fleet reads (``/v1/state``, ``/v1/devices``): a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``, half the cost of
    reading 10,000 device rows. The record built is equal to the one ``__init__``
    would build (``tests/store/test_scale_paths.py``); records here have no
    ``__post_init__`` and no slots, which this checks."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: not a plain dataclass")
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: has slots")
    names = tuple(f.name for f in dataclasses.fields(cls))
    new = object.__new__

    def build(row: Sequence[Any]) -> R:
        obj = new(cls)
        obj.__dict__.update(zip(names, row, strict=True))
        return obj

    return build


@dataclass(frozen=True)
class JobRecord:
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
    max_runtime: int
    idle_timeout: int
    queued_at: int
    kill_requested: int
    kill_delivered_at: int
    kind: str
    reason: str
    stdio: str
    device_count: int = 1
    #: 1 once the retention pass deleted the job's stored output (EXT-KEEP-1).
    logs_pruned: int = 0
    #: A several-device job's devices by ID (EXT-GANG-1); () for a one-device job.
    device_ids: tuple[str, ...] = ()
    #: What the worker measured of its GPUs (EXT-ACCT-1); None when nothing was sampled.
    gpu_util_mean: float | None = None
    gpu_mem_peak_bytes: int | None = None
    gpu_samples: int | None = None
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
            max_runtime=self.max_runtime,
            count=max(1, self.device_count),
            device_ids=self.device_ids if self.queued else (),
        )

    def columns(self) -> dict[str, Any]:
        """The row as the ``jobs`` table stores it."""
        m = {k: v for k, v in self.__dict__.items() if k != "lease_epoch"}
        m["command"] = json.dumps(self.command)
        m["env"] = json.dumps(self.env) if self.env else None
        m["device_ids"] = join_ids(self.device_ids)
        return m


def join_ids(ids: tuple[str, ...] | list[str]) -> str:
    """The stored form of a device list (``jobs.device_ids``): comma-separated, '' for ()."""
    return ",".join(ids)


def split_ids(text: str) -> tuple[str, ...]:
    return tuple(i for i in text.split(",") if i)


@dataclass(frozen=True)
class DeviceRecord:
    id: str
    host: str
    name: str
    worker_id: str
    state: str
    last_heartbeat_at: int
    max_runtime: int
    quarantine_reason: str
    quarantine_detail: str
    #: EXT-DRAIN-2: finishes what it runs, takes nothing new; who, when (0: never) and why.
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
            max_runtime=self.max_runtime,
            labels=labels or {},
            draining=bool(self.draining),
        )


@dataclass(frozen=True)
class LeaseRecord:
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


@dataclass(frozen=True)
class LabelRecord:
    device_id: str
    key: str
    value: str
    source: str
    updated_at: int


@dataclass(frozen=True)
class DeviceSnapshot:
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


@dataclass(frozen=True)
class Assigned:
    job_id: str
    worker_id: str


@dataclass(frozen=True)
class GpuUse:
    """What a terminal report says the job's GPUs did (EXT-ACCT-1); each part None when
    the worker measured nothing of it."""

    util_mean: float | None = None
    mem_peak_bytes: int | None = None
    samples: int | None = None


NO_GPU_USE = GpuUse()


@dataclass(frozen=True)
class Release:
    """Outcome of a terminal report: the job as it is now, and whether it already was terminal."""

    job: JobRecord
    was_terminal: bool


@dataclass(frozen=True)
class SweepResult:
    """What one sweep changed (STORE-104); lists of IDs, order unspecified.

    ``devices_unhealthy`` holds only silence write-offs: a device quarantined by an
    expired lease is reported through its lease (``leases_expired`` holds the job ID,
    or the lease's own ID for a job-less lease; STORE-171 maps either to the device).
    """

    devices_unknown: list[str] = field(default_factory=list)
    devices_unhealthy: list[str] = field(default_factory=list)
    jobs_lost: list[str] = field(default_factory=list)
    leases_expired: list[str] = field(default_factory=list)
    #: Whether this pass was allowed to expire leases and write workers off.
    judging: bool = True

    @property
    def alarming(self) -> bool:
        """Anything beyond mere ``unknown`` demotions (SRV-031: those are not worth a warning)."""
        return bool(self.devices_unhealthy or self.jobs_lost or self.leases_expired)


@dataclass(frozen=True)
class Recovered:
    """A device auto-recovery returned to the pool, and the reason it was quarantined for."""

    device_id: str
    reason: str


@dataclass(frozen=True)
class AutoRecovery:
    """Outcome of auto-recover (STORE-121): who came back, who the flap guard held back."""

    recovered: list[Recovered] = field(default_factory=list)
    #: Candidates skipped because they already recovered 3 times this hour.
    held_back: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RecoveryEntry:
    at: int
    reason: str


@dataclass(frozen=True)
class RecoveryHistory:
    """One device's automatic recoveries inside the sliding window (STORE-123)."""

    recoveries: list[RecoveryEntry]
    remaining: int
    limit: int
    window: int
