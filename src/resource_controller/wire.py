"""The JSON contract: pydantic models for every request and response body, with the
spec's field names (controller-api.md §5-7). Request models refuse wrong types (a bool
is never an int: API-001); response models use ``None`` for "omitted", serialised with
``exclude_none``.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from resource_controller import bounded as b


def _unwrap(annotation: Any) -> Any:
    """The annotation without ``Annotated[...]`` and without the ``None`` arm of an Optional."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            arms = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(arms) != 1:
                return annotation
            annotation = arms[0]
        else:
            return annotation


#: ``_shape``'s answers by annotation identity, each beside its annotation (which keeps
#: that identity from being reused).
_SHAPES: dict[int, tuple[Any, str, Any]] = {}


def _shape(annotation: Any) -> tuple[str, Any]:
    """``("list", item)``, ``("dict", value)`` or ``("", None)`` for ``annotation``,
    worked out once: the typing introspection costs more than a body."""
    known = _SHAPES.get(id(annotation))
    if known is not None and known[0] is annotation:
        return known[1], known[2]
    shape = _unwrap(annotation)
    origin = typing.get_origin(shape) or shape
    args = typing.get_args(shape)
    kind, inner = "", None
    if origin is list and args:
        kind, inner = "list", args[0]
    elif origin is list:
        kind = "list"
    elif origin is dict:
        kind, inner = "dict", (args[1] if len(args) == 2 else None)
    _SHAPES[id(annotation)] = (annotation, kind, inner)
    return kind, inner


def null_means_empty(annotation: Any, value: Any) -> Any:
    """``value`` with every ``null`` where ``annotation`` takes a list or a map made
    empty, through list items and map values (EXT-COMPAT-1: the reference encoder writes
    ``{"gpu0": null}``); anything else is left for validation to judge."""
    kind, inner = _shape(annotation)
    if kind == "list":
        if value is None:
            return []
        if isinstance(value, list) and inner is not None:
            return [null_means_empty(inner, v) for v in value]
    elif kind == "dict":
        if value is None:
            return {}
        if isinstance(value, dict) and inner is not None:
            return {k: null_means_empty(inner, v) for k, v in value.items()}
    return value


class _Request(BaseModel):
    """A body the controller reads: ``null`` for a field means leaving it out (its
    default), and below the top level a ``null`` where a list or a map belongs is that
    empty container (``null_means_empty``, EXT-COMPAT-1). Where the default is ``None``
    the routes read it as empty, except ``labels``, ``declared_labels`` and
    ``device_sheets``, where ``None`` means "not sent: leave the stored facts alone".
    Strictness is untouched: the conversion only ever produces ``[]`` or ``{}``."""

    model_config = ConfigDict(extra="ignore")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            key: null_means_empty(fields[key].annotation, value) if key in fields else value
            for key, value in data.items()
            # An unknown field stays, even as null, for a client body to refuse it.
            if value is not None or key not in fields
        }


class _ClientRequest(_Request):
    """A body a client sends: a field this controller does not know is ``400
    bad_request`` naming it, not ignored as API-001 has it, since an ignored misspelt
    field (``"device"`` for ``device_id``) is a setting that silently did not happen.
    Worker bodies keep API-001's rule: refusing a daemon's heartbeat over a field a
    newer version added would take its devices out of the pool."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- worker side ---------------------------------------------------------------------


class DeviceDecl(_Request):
    name: b.DeviceName
    max_runtime_seconds: b.Seconds | None = None


class RecoveryProof(_Request):
    isolated: StrictBool = False
    survivors_checked: StrictBool = False
    survivors_found: StrictBool = False


class RegisterRequest(_Request):
    host: b.HostName = ""
    boot_id: StrictStr = ""
    devices: list[DeviceDecl] = Field(default_factory=list)
    recovery: RecoveryProof | None = None
    labels: dict[str, dict[str, StrictStr]] | None = None
    declared_labels: dict[str, dict[str, StrictStr]] | None = None
    sheet: StrictStr | None = None
    device_sheets: dict[str, StrictStr] | None = None


class RegisterResponse(_Response):
    worker_id: str


class LabelsPush(_Request):
    host: b.HostName = ""
    devices: list[b.DeviceName] = Field(default_factory=list)
    labels: dict[str, dict[str, StrictStr]] | None = None
    declared_labels: dict[str, dict[str, StrictStr]] | None = None
    sheet: StrictStr | None = None
    device_sheets: dict[str, StrictStr] | None = None


class HeartbeatRequest(_Request):
    running_job_ids: list[StrictStr] | None = None
    #: Finished jobs whose terminal report still waits in the worker's outbox.
    pending_job_ids: list[StrictStr] | None = None


class Assignment(_Response):
    job_id: str
    device_id: str
    command: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    max_runtime_seconds: int | None = None
    idle_timeout_seconds: int | None = None
    submitter: str | None = None
    kind: str | None = None
    stdio: str | None = None
    #: Fencing token of the lease; omitted for epoch 0.
    lease_epoch: int | None = None
    #: Every device of the job, ascending; ``device_id`` is the first.
    device_ids: list[str] | None = None


class AssignmentsResponse(_Response):
    assignments: list[Assignment]
    kills: list[str] | None = None


class StatusReport(_Request):
    worker_id: StrictStr = ""
    state: StrictStr = ""
    exit_code: b.ExitCode | None = None
    reason: StrictStr = ""
    lease_epoch: StrictInt | None = None
    #: What the job's GPUs did, sent with the outcome; each omitted when
    #: nothing was sampled. A value out of its range reads as not sent: a measurement
    #: never costs the outcome it rides with (``bounded._measured``).
    gpu_util_mean: b.UtilPercent = None
    gpu_mem_peak_bytes: b.MeasuredBytes = None
    samples: b.MeasuredCount = None


class FaultReport(_Request):
    reason: StrictStr = ""


# ---- client side ---------------------------------------------------------------------


class SubmitRequest(_ClientRequest):
    device_id: StrictStr = ""
    selector: b.SelectorText = ""
    command: b.Command | None = None
    cwd: b.Cwd = ""
    env: b.Env | None = None
    submitter: b.Submitter = ""
    idempotency_key: b.IdempotencyKey = ""
    priority: StrictInt = 0
    max_runtime_seconds: b.Seconds = 0
    idle_timeout_seconds: b.Seconds = 0
    no_wait: StrictBool = False
    kind: StrictStr = ""
    reason: b.Reason = ""
    stdio: StrictStr = ""
    #: Devices wanted on one host; ``device_ids`` pins to a list of them
    #: in place of ``device_id``.
    count: b.DeviceCount = 1
    device_ids: b.DeviceIds | None = None
    #: Jobs (full IDs) this one waits for; only ``succeeded`` lets it go on, any end
    #: with ``after_any``.
    after: b.AfterIds | None = None
    after_any: StrictBool = False


class KillRequest(_ClientRequest):
    submitter: b.Submitter = ""


class DrainRequest(_ClientRequest):
    """``POST /v1/devices/{id}/drain``: who asks, and why."""

    submitter: b.Submitter = ""
    reason: b.Reason = ""


class Job(_Response):
    id: str
    selector: str
    kind: str
    command: list[str]
    cwd: str
    env: dict[str, str] | None = None
    submitter: str
    idempotency_key: str | None = None
    priority: int
    max_runtime_seconds: int | None = None
    idle_timeout_seconds: int | None = None
    queued_at: str | None = None
    state: str
    device_id: str
    worker_id: str
    exit_code: int | None = None
    kill_reason: str | None = None
    reason: str | None = None
    stdio: str | None = None
    submitted_at: str
    started_at: str | None = None
    finished_at: str | None = None
    #: Fencing epoch of the job's latest lease; omitted when none.
    lease_epoch: int | None = None
    #: Every device of the job, ascending, beside ``device_id`` (the first);
    #: omitted while it has none.
    device_ids: list[str] | None = None
    #: The jobs it waits for, as submitted, and ``true`` when any end of
    #: theirs will do; omitted for a job that named none.
    after: list[str] | None = None
    after_any: bool | None = None
    #: Mean GPU utilisation (percent), peak GPU memory (bytes) and the
    #: readings they come from; omitted when nothing was sampled.
    gpu_util_mean: float | None = None
    gpu_mem_peak_bytes: int | None = None
    samples: int | None = None


class WaitingFor(_Response):
    """What keeps a queued job from one device it could run on, or, as the
     whole list, from every device: its submitter's limit, or the jobs it waits for
    ; ``device_id`` is omitted from those."""

    device_id: str | None = None
    #: A held device: the lease's holder, job, kind and grant time.
    holder: str | None = None
    job_id: str | None = None
    kind: str | None = None
    #: The hold's reason, beside the spec's fields, so a client can name it.
    reason: str | None = None
    since: str | None = None
    #: The latest time the holder can keep it; omitted when it has no limit.
    until: str | None = None
    #: A queued job ahead of this one that has the device reserved.
    reserved_by: str | None = None
    #: A device out of the pool (``unknown``, ``unhealthy``).
    state: str | None = None
    quarantine_reason: str | None = None
    #: EXT-DRAIN-2; ``true`` or omitted.
    draining: bool | None = None
    #: Why the device's name conflicts with its GPU's MIG mode; omitted when
    #: it does not (an addition: base clients ignore it).
    mig_conflict: str | None = None
    #: The submitter is at its limit of this many devices; the name it
    #: counts under.
    submitter_limit: int | None = None
    submitter: str | None = None
    #: A job this one waits for that has not ended.
    after: str | None = None


class JobView(_Response):
    job: Job
    queue_position: int | None = None
    #: One entry per candidate device, by device ID; omitted when not queued.
    waiting_for: list[WaitingFor] | None = None


class JobList(_Response):
    jobs: list[Job]


class Label(_Response):
    key: str
    value: str
    source: str
    updated_at: str


class Device(_Response):
    id: str
    host: str
    name: str
    worker_id: str
    state: str
    last_heartbeat_at: str
    labels: list[Label] | None = None
    max_runtime_seconds: int | None = None
    #: ``true`` or omitted; who, when and why only while draining.
    draining: bool | None = None
    drained_by: str | None = None
    drained_at: str | None = None
    drain_reason: str | None = None


class DeviceView(_Response):
    device: Device
    holder: str | None = None
    job_id: str | None = None
    kind: str | None = None
    reason: str | None = None
    command: list[str] | None = None
    elapsed_seconds: int
    heartbeat_age_seconds: int
    oldest_label_age_seconds: int | None = None
    quarantine_reason: str | None = None


class State(_Response):
    devices: list[DeviceView]
    jobs: list[Job]
    queued: list[Job]
    queued_waiting_seconds: dict[str, int] | None = None
    #: Queued job ID -> its ``waiting_for``; omitted when nothing is queued.
    queued_waiting_for: dict[str, list[WaitingFor]] | None = None


class Recovery(_Response):
    at: str
    #: The quarantine reason the device was automatically recovered from.
    reason: str


class RecoveryHistory(_Response):
    """A device's automatic recoveries inside the flap guard's sliding window."""

    recoveries: list[Recovery]
    #: Automatic recoveries left this window; 0 means the next quarantine waits for a person.
    remaining: int
    limit: int
    window_seconds: int


class Describe(_Response):
    device: Device
    holder: str | None = None
    job_id: str | None = None
    elapsed_seconds: int
    heartbeat_age_seconds: int
    quarantine_reason: str | None = None
    labels: list[Label] | None = None
    label_age_seconds: dict[str, int] | None = None
    sheet: str | None = None
    sheet_updated_at: str
    sheet_age_seconds: int | None = None
    sheet_is_host_wide: bool | None = None
    recent_jobs: list[Job] | None = None
    #: Extension beside the base fields: the flap-guard history, always present.
    recoveries: RecoveryHistory | None = None


class Explain(_Response):
    selector: str
    matching: list[str]
    free: list[str]
    queue_depth: int
    #: When nothing matches: the values the devices have for the selector's keys
    #: (``selectors.no_match_hint``); omitted otherwise.
    hint: str | None = None
    #: EXT-SHARE-1, when a limit applies to the asking submitter: the name it counts
    #: under, its limit and the devices it holds.
    submitter: str | None = None
    submitter_limit: int | None = None
    submitter_held: int | None = None


class Whoami(_Response):
    role: str
    #: Only when the token has a name.
    name: str | None = None


class Retired(_Response):
    retired: str
    note: str


class UsageTotal(_Response):
    """A usage window's figures summed over every group."""

    jobs: int
    #: Held time × devices, in hours.
    device_hours: float
    #: Device-hours weighted by the jobs' mean GPU utilisation, over the jobs that
    #: measured one; omitted when none did.
    gpu_hours: float | None = None
    #: The part of ``device_hours`` whose utilisation is known; omitted when none is.
    sampled_device_hours: float | None = None


class UsageGroup(_Response):
    """One submitter's, device's or host's use in the window."""

    group: str
    jobs: int
    device_hours: float
    gpu_hours: float | None = None
    sampled_device_hours: float | None = None
    #: Its part of the window's device-hours, 0..1.
    share: float | None = None


class Usage(_Response):
    """``GET /v1/usage``: who held what, largest first."""

    by: str
    #: The window: from the start of the hour that holds now minus ``since``, to now.
    since: str
    until: str
    groups: list[UsageGroup]
    total: UsageTotal
    #: Groups left out past ``limit`` (counted in ``total``); omitted when none.
    more: int | None = None


class ErrorBody(_Response):
    error: str
    message: str
