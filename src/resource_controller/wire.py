"""The JSON contract: pydantic models for every request and response body, with the
spec's field names (controller-api.md §5-7); in a response ``None`` means "omitted".
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


#: By annotation identity, beside the annotation (which keeps that identity in use).
_SHAPES: dict[int, tuple[Any, str, Any]] = {}


def _shape(annotation: Any) -> tuple[str, Any]:
    """``("list", item)``, ``("dict", value)`` or ``("", None)``, worked out once: the
    introspection costs more than a body."""
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
    """Every ``null`` where ``annotation`` takes a list or a map made empty, at any depth
    (EXT-COMPAT-1: the reference encoder writes ``{"gpu0": null}``)."""
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
    """A body the controller reads: a ``null`` field is left out, and below it a ``null``
    list or map is empty (EXT-COMPAT-1). ``None`` for ``labels``, ``declared_labels`` and
    ``device_sheets`` means "not sent: leave the stored facts alone"."""

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
    """A body a client sends: an unknown field is ``400`` (a misspelt setting must not
    silently not happen); worker bodies ignore one, as API-001 has it."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    #: Seconds from SIGTERM to SIGKILL for the kills that stop a preemption's victim
    #: (EXT-PREEMPT-2); a worker that does not know it uses its own ``kill_grace``.
    kill_grace: dict[str, int] | None = None


class StatusReport(_Request):
    worker_id: StrictStr = ""
    state: StrictStr = ""
    exit_code: b.ExitCode | None = None
    reason: StrictStr = ""
    lease_epoch: StrictInt | None = None
    #: A value out of range reads as not sent: never costs the outcome it rides with.
    gpu_util_mean: b.UtilPercent = None
    gpu_mem_peak_bytes: b.MeasuredBytes = None
    samples: b.MeasuredCount = None


class FaultReport(_Request):
    reason: StrictStr = ""


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
    #: Devices wanted on one host; ``device_ids`` pins them in place of ``device_id``.
    count: b.DeviceCount = 1
    device_ids: b.DeviceIds | None = None
    #: Jobs this one waits for: to succeed, or with ``after_any`` to end.
    after: b.AfterIds | None = None
    after_any: StrictBool = False
    #: EXT-RETRY-1: attempts after the first, and which ends call for one (lost, failed, any).
    retries: b.Retries = 0
    retry_on: StrictStr = ""
    #: EXT-PREEMPT-1/2: may be stopped to make room; then ends instead of queueing again; its
    #: own grace between SIGTERM and SIGKILL (0: the controller's).
    preemptible: StrictBool = False
    no_requeue: StrictBool = False
    preempt_grace_seconds: b.Seconds = 0
    #: EXT-ARRAY-1: one task per index of this spec (``0-99%8``); the answer is an ``ArrayBody``.
    array: b.ArraySpecText = ""


class KillRequest(_ClientRequest):
    submitter: b.Submitter = ""


class DrainRequest(_ClientRequest):
    """``POST /v1/devices/{id}/drain``: who asks, and why."""

    submitter: b.Submitter = ""
    reason: b.Reason = ""


class AttemptBody(_Response):
    """One attempt of a job (EXT-RETRY-1): where it ran and how it ended."""

    attempt: int
    device_id: str
    device_ids: list[str] | None = None
    worker_id: str
    started_at: str | None = None
    ended_at: str | None = None
    #: A job state, or ``preempted``; the current attempt's is the job's.
    state: str
    exit_code: int | None = None
    kill_reason: str | None = None


class JobBody(_Response):
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
    #: Every device of the job, ascending; ``device_id`` is the first.
    device_ids: list[str] | None = None
    #: The jobs it waits for, as submitted.
    after: list[str] | None = None
    after_any: bool | None = None
    #: Mean GPU utilisation (percent), peak GPU memory (bytes), and the readings.
    gpu_util_mean: float | None = None
    gpu_mem_peak_bytes: int | None = None
    samples: int | None = None
    #: EXT-RETRY-1: the attempt running or last run (absent: the first), the retries it may take and on
    #: what; ``attempts`` (the job view's alone) every attempt so far, the current one last.
    attempt: int | None = None
    retries: int | None = None
    retry_on: str | None = None
    attempts: list[AttemptBody] | None = None
    #: EXT-PREEMPT-1/2.
    preemptible: bool | None = None
    no_requeue: bool | None = None
    preempt_grace_seconds: int | None = None
    preempted_by: str | None = None
    preemptions: int | None = None
    #: EXT-ARRAY-1: the array it is a task of, and its index there.
    array_id: str | None = None
    array_index: int | None = None


class WaitingFor(_Response):
    """What keeps a queued job from one device, or (no ``device_id``) from every one."""

    device_id: str | None = None
    holder: str | None = None
    job_id: str | None = None
    kind: str | None = None
    reason: str | None = None
    since: str | None = None
    until: str | None = None
    reserved_by: str | None = None
    state: str | None = None
    quarantine_reason: str | None = None
    draining: bool | None = None
    mig_conflict: str | None = None
    submitter_limit: int | None = None
    submitter: str | None = None
    after: str | None = None
    #: EXT-PREEMPT-2: the jobs being stopped to make room for this one.
    preempting: list[str] | None = None
    #: EXT-ARRAY-1: its array runs as many tasks at once as its cap allows.
    array_id: str | None = None
    array_limit: int | None = None


class TaskBody(_Response):
    """One task of an array, as its array's view shows it."""

    id: str
    index: int
    state: str
    exit_code: int | None = None
    device_id: str
    worker_id: str


class ArrayBody(_Response):
    """An array (EXT-ARRAY-3): its spec, its tasks by state, and each task in index order."""

    id: str
    spec: str
    size: int
    #: The ``%N`` cap on tasks running at once; 0: none.
    max_running: int
    submitter: str
    submitted_at: str
    #: Tasks in each state that any task is in.
    counts: dict[str, int]
    tasks: list[TaskBody]


class JobView(_Response):
    job: JobBody
    queue_position: int | None = None
    waiting_for: list[WaitingFor] | None = None


class JobList(_Response):
    jobs: list[JobBody]


class LabelBody(_Response):
    key: str
    value: str
    source: str
    updated_at: str


class DeviceBody(_Response):
    id: str
    host: str
    name: str
    worker_id: str
    state: str
    last_heartbeat_at: str
    labels: list[LabelBody] | None = None
    max_runtime_seconds: int | None = None
    draining: bool | None = None
    drained_by: str | None = None
    drained_at: str | None = None
    drain_reason: str | None = None


class DeviceView(_Response):
    device: DeviceBody
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
    jobs: list[JobBody]
    queued: list[JobBody]
    queued_waiting_seconds: dict[str, int] | None = None
    queued_waiting_for: dict[str, list[WaitingFor]] | None = None


class Recovery(_Response):
    at: str
    reason: str


class RecoveryHistory(_Response):
    """A device's automatic recoveries inside the flap guard's sliding window."""

    recoveries: list[Recovery]
    remaining: int
    limit: int
    window_seconds: int


class Describe(_Response):
    device: DeviceBody
    holder: str | None = None
    job_id: str | None = None
    elapsed_seconds: int
    heartbeat_age_seconds: int
    quarantine_reason: str | None = None
    labels: list[LabelBody] | None = None
    label_age_seconds: dict[str, int] | None = None
    sheet: str | None = None
    sheet_updated_at: str
    sheet_age_seconds: int | None = None
    sheet_is_host_wide: bool | None = None
    recent_jobs: list[JobBody] | None = None
    recoveries: RecoveryHistory | None = None


class Explain(_Response):
    selector: str
    matching: list[str]
    free: list[str]
    queue_depth: int
    hint: str | None = None
    #: EXT-SHARE-1, when a limit applies to the asking submitter.
    submitter: str | None = None
    submitter_limit: int | None = None
    submitter_held: int | None = None


class Whoami(_Response):
    role: str
    name: str | None = None


class Retired(_Response):
    retired: str
    note: str


class UsageTotal(_Response):
    """A usage window's figures summed over every group."""

    jobs: int
    device_hours: float
    #: Device-hours weighted by the mean GPU utilisation, and those whose is known.
    gpu_hours: float | None = None
    sampled_device_hours: float | None = None


class UsageGroupBody(_Response):
    """One submitter's, device's or host's use in the window."""

    group: str
    jobs: int
    device_hours: float
    gpu_hours: float | None = None
    sampled_device_hours: float | None = None
    share: float | None = None


class UsageBody(_Response):
    """``GET /v1/usage``: who held what, largest first."""

    by: str
    since: str
    until: str
    groups: list[UsageGroupBody]
    total: UsageTotal
    #: Groups left out past ``limit`` (counted in ``total``).
    more: int | None = None


class ErrorBody(_Response):
    error: str
    message: str
