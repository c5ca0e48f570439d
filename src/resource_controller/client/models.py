"""Typed views of the controller's objects; ``raw`` keeps fields a newer controller sends.
Parsing never fails on an unknown or missing key. No pydantic: ``Client()`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from resource_controller.core import mig
from resource_controller.core.cuda import cuda_visible_devices
from resource_controller.core.states import TERMINAL, JobState

Json = dict[str, Any]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read(data: Mapping[str, Any], cls: type, **given: Any) -> dict[str, Any]:
    """Fields read by their declared types, an unusable value as that type's empty one."""
    for f in fields(cls):
        if f.name not in given and f.type in _READERS:
            given[f.name] = _READERS[f.type](data.get(f.name))
    return given


def timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass
class JobInfo:
    """A job or hold as the controller last described it; omitted fields are empty
    (``exit_code`` ``None`` until reported, so "no code yet" and "exit 0" differ)."""

    id: str
    state: str = ""
    kind: str = "job"
    command: list[str] = field(default_factory=list)
    selector: str = ""
    #: The device, ``""`` until a selector or any-device job is placed.
    device_id: str = ""
    device_ids: list[str] = field(default_factory=list)
    worker_id: str = ""
    submitter: str = ""
    priority: int = 0
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    max_runtime_seconds: int = 0
    idle_timeout_seconds: int = 0
    exit_code: int | None = None
    #: Why it ended when it did not simply exit (``cancelled``, ``lease expired``, ...).
    kill_reason: str = ""
    reason: str = ""
    stdio: str = ""
    lease_epoch: int = 0
    submitted_at: datetime | None = None
    queued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue_position: int = 0
    waiting_for: list[Json] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    after_any: bool = False
    #: Once it ended; ``None`` when nothing was sampled.
    gpu_util_mean: float | None = None
    gpu_mem_peak_bytes: int | None = None
    samples: int | None = None
    #: EXT-RETRY-1: the attempt running or last run, the retries it may take, and (from
    #: ``client.job(id)``) every attempt so far as the controller describes it.
    attempt: int = 1
    retries: int = 0
    attempts: list[Json] = field(default_factory=list)
    #: EXT-ARRAY-1: the array it is a task of ('' for none) and its index there.
    array_id: str = ""
    array_index: int | None = None
    raw: Json = field(default_factory=dict, repr=False)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.state == JobState.SUCCEEDED

    def _load(self, data: Mapping[str, Any], position: int = 0, waits: Any = None) -> None:
        device_id = _str(data.get("device_id"))
        env = data.get("env")
        queued = _str(data.get("state")) == "queued"
        entries = waits if isinstance(waits, list) and queued else []
        values = _read(
            data,
            JobInfo,
            id=_str(data.get("id")) or self.id,
            kind=_str(data.get("kind")) or "job",
            device_ids=_strs(data.get("device_ids")) or ([device_id] if device_id else []),
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
            queue_position=position if queued else 0,
            waiting_for=[dict(w) for w in entries if isinstance(w, dict)],
            attempt=data.get("attempt") if _is_int(data.get("attempt")) else 1,
            attempts=[dict(a) for a in data.get("attempts") or [] if isinstance(a, dict)],
            raw=dict(data),
        )
        for name, value in values.items():
            setattr(self, name, value)


@dataclass(frozen=True)
class ArrayInfo:
    """An array as the controller last described it (EXT-ARRAY-3): its tasks in index order,
    each ``{"id", "index", "state", "exit_code", "device_id", "worker_id"}``."""

    id: str
    spec: str = ""
    size: int = 0
    #: The ``%N`` cap on tasks running at once; 0: none.
    max_running: int = 0
    submitter: str = ""
    submitted_at: datetime | None = None
    counts: dict[str, int] = field(default_factory=dict)
    tasks: list[Json] = field(default_factory=list)
    raw: Json = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ArrayInfo:
        return cls(**_read(data, cls, raw=dict(data)))

    @property
    def done(self) -> bool:
        """Every task has ended."""
        return all(t.get("state") in TERMINAL for t in self.tasks)

    @property
    def failed(self) -> list[int]:
        """The indexes of the tasks that ended otherwise than ``succeeded``, ascending."""
        return [
            int(t.get("index") or 0)
            for t in self.tasks
            if t.get("state") in TERMINAL and t.get("state") != JobState.SUCCEEDED
        ]


@dataclass(frozen=True)
class Label:
    key: str
    value: str
    source: str
    updated_at: datetime | None = None


def effective_labels(labels: list[Label]) -> dict[str, str]:
    """A detected value wins over a declared one, as selectors see them."""
    out: dict[str, str] = {}
    for label in labels:
        if label.source == "detected" or label.key not in out:
            out[label.key] = label.value
    return out


@dataclass(frozen=True)
class Device:
    """A device and who holds it (from ``describe()``, no holder ``kind``/``reason``/``command``)."""

    id: str
    host: str = ""
    name: str = ""
    worker_id: str = ""
    state: str = ""
    last_heartbeat_at: datetime | None = None
    labels: list[Label] = field(default_factory=list)
    max_runtime_seconds: int = 0
    draining: bool = False
    holder: str = ""
    job_id: str = ""
    kind: str = ""
    reason: str = ""
    command: list[str] = field(default_factory=list)
    elapsed_seconds: int = 0
    heartbeat_age_seconds: int = 0
    quarantine_reason: str = ""
    raw: Json = field(default_factory=dict, repr=False)

    @property
    def free(self) -> bool:
        """Ready, held by nobody and not draining: a submit for it would start now."""
        return self.state == "ready" and not self.job_id and not self.draining

    @property
    def label_map(self) -> dict[str, str]:
        return effective_labels(self.labels)

    @classmethod
    def from_view(cls, view: Mapping[str, Any]) -> Device:
        dev = view.get("device")
        # The device's fields, its holder's from the view (a describe's own labels aside).
        merged = {**view, "labels": None, **(dev if isinstance(dev, dict) else {})}
        return cls(**_read(merged, cls, raw=dict(view)))


@dataclass(frozen=True)
class DeviceDetails:
    device: Device
    sheet: str = ""
    sheet_is_host_wide: bool = False
    sheet_updated_at: datetime | None = None
    #: ``"<label key>/<source>"`` to seconds since that label was confirmed.
    label_age_seconds: dict[str, int] = field(default_factory=dict)
    recent_jobs: list[JobInfo] = field(default_factory=list)
    raw: Json = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeviceDetails:
        ages = data.get("label_age_seconds")
        jobs = data.get("recent_jobs")
        recent = []
        for j in jobs if isinstance(jobs, list) else []:
            if isinstance(j, dict):
                recent.append(info := JobInfo(""))
                info._load(j)
        ages = ages if isinstance(ages, dict) else {}
        return cls(
            **_read(
                data,
                cls,
                device=Device.from_view(data),
                label_age_seconds={str(k): v for k, v in ages.items() if isinstance(v, int)},
                recent_jobs=recent,
                raw=dict(data),
            )
        )


@dataclass(frozen=True)
class Explanation:
    selector: str
    matching: list[str] = field(default_factory=list)
    free: list[str] = field(default_factory=list)
    queue_depth: int = 0
    #: When nothing matches: what the devices have for the selector's keys; else "".
    hint: str = ""
    submitter: str = ""
    submitter_limit: int | None = None
    submitter_held: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any], selector: str) -> Explanation:
        return cls(**_read(data, cls, selector=_str(data.get("selector")) or selector))


@dataclass(frozen=True)
class RunResult:
    """How ``run()`` ended: the exit code ``rc run`` would exit with, and the job."""

    #: 1 for a job that ended with no code (killed while queued, lost, ...).
    exit_code: int
    job: JobInfo
    output: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return (self.output or b"").decode("utf-8", "replace")


@dataclass(frozen=True)
class LeaseInfo:
    """A granted hold: what code on the device host needs to use it."""

    id: str
    device_id: str
    device_ids: list[str]
    #: The fencing epoch, for stamping writes to shared storage; 0 if none.
    epoch: int
    #: ``None`` when a device has no index or UUID, as the worker leaves it unset.
    cuda_visible_devices: str | None
    ttl_seconds: int

    @property
    def env(self) -> dict[str, str]:
        env = {"RC_DEVICE": self.device_id, "RC_DEVICES": ",".join(self.device_ids)}
        if self.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        if self.epoch:
            env["RC_LEASE_EPOCH"] = str(self.epoch)
        return env

    @classmethod
    def from_job(cls, job: JobInfo, mig_uuids: Mapping[str, str] | None = None) -> LeaseInfo:
        ids = sorted(job.device_ids) if len(job.device_ids) > 1 else list(job.device_ids)
        return cls(
            id=job.id,
            device_id=job.device_id or (ids[0] if ids else ""),
            device_ids=ids,
            epoch=job.lease_epoch,
            cuda_visible_devices=cuda_visible_devices(ids, mig_uuids),
            ttl_seconds=job.max_runtime_seconds,
        )


def mig_instance_ids(device_ids: Sequence[str]) -> list[str]:
    """Only their worker knows a MIG instance's UUID, which a lease must ask for."""
    return [d for d in device_ids if mig.is_instance(d.partition(":")[2])]


def detected_uuid(describe: Mapping[str, Any]) -> str:
    labels = describe.get("labels")
    for label in labels if isinstance(labels, list) else []:
        if isinstance(label, dict) and (label.get("key"), label.get("source")) == (
            "uuid",
            "detected",
        ):
            return str(label.get("value") or "")
    return ""


@dataclass(frozen=True)
class UsageGroup:
    """One submitter's, device's or host's use over a window."""

    #: ``""`` for a window's total.
    group: str
    jobs: int = 0
    #: Held time × devices, in hours.
    device_hours: float = 0.0
    #: Device-hours weighted by the jobs' mean GPU utilisation, over the jobs that
    #: measured one; ``None`` when none did.
    gpu_hours: float | None = None
    sampled_device_hours: float = 0.0
    #: Its part of the window's device-hours (0..1); ``None`` for the total.
    share: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UsageGroup:
        return cls(**_read(data, cls))


@dataclass(frozen=True)
class Usage:
    """Who held what over a window, largest first (``Client.usage``)."""

    by: str
    #: The window: from the start of the hour that held now minus ``since``, to now.
    since: datetime | None = None
    until: datetime | None = None
    groups: list[UsageGroup] = field(default_factory=list)
    #: Every group of the window summed, those past the limit included.
    total: UsageGroup = field(default_factory=lambda: UsageGroup(""))
    more: int = 0
    raw: Json = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        groups = data.get("groups")
        total = data.get("total")
        return cls(
            **_read(
                data,
                cls,
                groups=[UsageGroup.from_json(g) for g in (groups or []) if isinstance(g, dict)],
                total=UsageGroup.from_json(total if isinstance(total, dict) else {}),
                raw=dict(data),
            )
        )


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _strs(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


_READERS: dict[str, Callable[[Any], Any]] = {
    "str": _str,
    "int": lambda v: v if _is_int(v) else 0,
    "int | None": lambda v: v if _is_int(v) else None,
    "float": lambda v: float(v) if _is_number(v) else 0.0,
    "float | None": lambda v: float(v) if _is_number(v) else None,
    "bool": lambda v: v is True,
    "list[str]": _strs,
    "dict[str, int]": lambda v: (
        {str(k): n for k, n in v.items() if _is_int(n)} if isinstance(v, dict) else {}
    ),
    "list[Json]": lambda v: (
        [dict(o) for o in v if isinstance(o, dict)] if isinstance(v, list) else []
    ),
    "datetime | None": timestamp,
    "list[Label]": lambda v: [
        Label(**_read(row, Label))
        for row in (v if isinstance(v, list) else [])
        if isinstance(row, dict)
    ],
}
