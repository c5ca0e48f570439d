"""Store records into wire models; every age measured here, on the controller's clock."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any, TypeVar

import pydantic
import pydantic_core

from resource_controller import wire
from resource_controller.core import usage as acct
from resource_controller.core.states import DeviceState
from resource_controller.core.waiting import Blocker, rfc3339
from resource_controller.store.arrays import ArrayRecord, TaskRecord
from resource_controller.store.records import (
    AttemptRecord,
    DeviceRecord,
    DeviceSnapshot,
    JobRecord,
    LabelRecord,
    split_ids,
)

ZERO_INSTANT = "0001-01-01T00:00:00Z"

M = TypeVar("M", bound=pydantic.BaseModel)


def _new(model: type[M], **fields: Any) -> M:
    """A response model built without validation (70 % of rendering ``/v1/state``);
    ``tests/controller/test_render.py`` holds each builder to what validation accepts."""
    m = model.__new__(model)
    # The serializer writes fields in ``__dict__``'s order, which ``update`` keeps.
    values = _defaults(model).copy()
    values.update(fields)
    object.__setattr__(m, "__dict__", values)
    object.__setattr__(m, "__pydantic_fields_set__", set(fields))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m


@functools.cache
def _defaults(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """Every field's default (None when required), for ``_new`` to copy; checked immutable."""
    out: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        if f.default_factory is not None:
            raise TypeError(f"{model.__name__}.{name}: a default factory cannot be shared")
        default = None if f.is_required() else f.default
        if not isinstance(default, str | int | float | bool | type(None)):
            raise TypeError(f"{model.__name__}.{name}: mutable default {default!r}")
        out[name] = default
    return out


@functools.lru_cache(maxsize=8192)
def ts(seconds: int | None) -> str | None:
    """``waiting.rfc3339``, None staying None; cached: timestamps fall on few distinct seconds."""
    return None if seconds is None else rfc3339(seconds)


def job(j: JobRecord, past: list[AttemptRecord] | None = None) -> wire.JobBody:
    """The Job object: empty and zero fields become omitted."""
    return _new(
        wire.JobBody,
        id=j.id,
        selector=j.selector,
        kind=j.kind,
        command=j.command,
        cwd=j.cwd,
        env=j.env or None,
        submitter=j.submitter,
        idempotency_key=j.idempotency_key or None,
        priority=j.priority,
        max_runtime_seconds=j.max_runtime_seconds or None,
        idle_timeout_seconds=j.idle_timeout or None,
        queued_at=ts(j.queued_at) if j.queued_at else None,
        state=j.state,
        device_id=j.device_id,
        worker_id=j.worker_id,
        exit_code=j.exit_code,
        kill_reason=j.kill_reason or None,
        reason=j.reason or None,
        stdio=j.stdio or None,
        submitted_at=ts(j.submitted_at) or "",
        started_at=ts(j.started_at),
        finished_at=ts(j.finished_at),
        lease_epoch=j.lease_epoch or None,
        device_ids=list(j.devices) or None,
        after=list(j.after_ids) or None,
        after_any=True if j.after_any and j.after_ids else None,
        gpu_util_mean=j.gpu_util_mean,
        gpu_mem_peak_bytes=j.gpu_mem_peak_bytes,
        samples=j.gpu_samples,
        attempt=j.attempt if j.attempt > 1 else None,
        retries=j.retries or None,
        retry_on=j.retry_on if j.retries else None,
        attempts=None if past is None else [*map(_attempt, past), *_current(j)],
        preemptible=bool(j.preemptible) or None,
        no_requeue=bool(j.no_requeue) or None,
        preempt_grace_seconds=j.preempt_grace_seconds or None,
        preempted_by=j.preempted_by or None,
        preemptions=j.preemptions or None,
        array_id=j.array_id or None,
        array_index=j.array_index if j.array_id else None,
    )


def array(a: ArrayRecord, tasks: list[TaskRecord]) -> wire.ArrayBody:
    """An array's view: its counts are its tasks'."""
    return wire.ArrayBody(
        **vars(a) | {"submitted_at": ts(a.submitted_at) or ""},
        counts=dict(Counter(t.state for t in tasks)),
        tasks=[wire.TaskBody(**vars(t)) for t in tasks],
    )


def _attempt(a: AttemptRecord) -> wire.AttemptBody:
    devices = split_ids(a.device_ids)
    return _new(
        wire.AttemptBody,
        attempt=a.attempt,
        device_id=devices[0] if devices else "",
        device_ids=list(devices) if len(devices) > 1 else None,
        worker_id=a.worker_id,
        started_at=ts(a.started_at),
        ended_at=ts(a.ended_at),
        state=a.state,
        exit_code=a.exit_code,
        kill_reason=a.kill_reason or None,
    )


def _current(j: JobRecord) -> list[wire.AttemptBody]:
    """The attempt on the job row, once it has a device (a queued retry has none yet)."""
    if j.queued:
        return []
    ended = ts(j.finished_at) if j.terminal else None
    return [
        _new(
            wire.AttemptBody,
            attempt=j.attempt,
            device_id=j.device_id,
            device_ids=list(j.devices) if len(j.devices) > 1 else None,
            worker_id=j.worker_id,
            started_at=ts(j.started_at),
            ended_at=ended,
            state=j.state,
            exit_code=j.exit_code,
            kill_reason=j.kill_reason or None,
        )
    ]


def device_body(d: DeviceRecord, labels: list[LabelRecord]) -> dict[str, Any]:
    """The Device object as JSON: the ceiling always (EXT-CLI-6), ``draining`` only when true."""
    out: dict[str, Any] = {
        "id": d.id,
        "host": d.host,
        "name": d.name,
        "worker_id": d.worker_id,
        "state": d.state,
        "last_heartbeat_at": ts(d.last_heartbeat_at) or "",
    }
    if labels:
        out["labels"] = [
            {
                "key": lb.key,
                "value": lb.value,
                "source": lb.source,
                "updated_at": ts(lb.updated_at) or "",
            }
            for lb in labels
        ]
    out["max_runtime_seconds"] = d.max_runtime_seconds
    if d.draining:
        out["draining"] = True
        if d.drained_by:
            out["drained_by"] = d.drained_by
        if d.drained_at:
            out["drained_at"] = ts(d.drained_at)
        if d.drain_reason:
            out["drain_reason"] = d.drain_reason
    return out


#: A plain string: comparing with the enum member costs four times as much, per device.
_UNHEALTHY = DeviceState.UNHEALTHY.value


def device_view_body(s: DeviceSnapshot, now: int) -> dict[str, Any]:
    """The device view as a plain JSON object: models per device were most of the cost."""
    lease, d = s.lease, s.device
    out: dict[str, Any] = {"device": device_body(d, s.labels)}
    if lease:
        out["holder"] = lease.holder
        if lease.job_id:
            out["job_id"] = lease.job_id
        out["kind"] = lease.kind
        if lease.reason:
            out["reason"] = lease.reason
        if s.command is not None:
            out["command"] = s.command
    out["elapsed_seconds"] = now - lease.acquired_at if lease else 0
    out["heartbeat_age_seconds"] = now - d.last_heartbeat_at
    if s.labels:
        out["oldest_label_age_seconds"] = now - min(lb.updated_at for lb in s.labels)
    if d.state == _UNHEALTHY and (why := d.quarantine_detail or d.quarantine_reason):
        out["quarantine_reason"] = why  # the detail when there is one, else the category
    return out


def device_view(s: DeviceSnapshot, now: int) -> wire.DeviceView:
    """The device view as its model, for the routes that read its parts (describe)."""
    return wire.DeviceView.model_validate(device_view_body(s, now))


def json_body(value: Any) -> bytes:
    """``value`` as a body, as ``model_dump_json(exclude_none=True)`` writes it."""
    return pydantic_core.to_json(value, exclude_none=True)


def waiting_for(blockers: list[Blocker]) -> list[wire.WaitingFor]:
    """A queued job's ``waiting_for``: empty and absent facts are omitted."""
    return [_waiting_entry(b) for b in blockers]


@functools.lru_cache(maxsize=4096)
def _waiting_entry(b: Blocker) -> wire.WaitingFor:
    """One entry, rendered once: the rules share an entry between the jobs it is the same for."""
    return _new(
        wire.WaitingFor,
        device_id=b.device_id or None,
        holder=b.holder or None,
        job_id=b.job_id or None,
        kind=b.kind or None,
        reason=b.reason or None,
        since=ts(b.since),
        until=ts(b.until),
        reserved_by=b.reserved_by or None,
        state=b.state or None,
        quarantine_reason=b.quarantine_reason or None,
        draining=b.draining or None,
        mig_conflict=b.mig_conflict or None,
        submitter_limit=b.submitter_limit,
        submitter=b.submitter or None,
        after=b.after or None,
        preempting=list(b.preempting) or None,
        array_id=b.array_id or None,
        array_limit=b.array_limit,
    )


def usage(w: acct.Window) -> wire.UsageBody:
    """A usage window: hours to the thousandth, shares to four places, GPU-hours where known."""

    def known(f: acct.Figures) -> dict[str, Any]:
        if f.sampled_seconds <= 0:
            return {}
        return {
            "gpu_hours": acct.gpu_hours(f),
            "sampled_device_hours": acct.hours(f.sampled_seconds),
        }

    return _new(
        wire.UsageBody,
        by=w.by,
        since=ts(w.start) or "",
        until=ts(w.end) or "",
        groups=[
            _new(
                wire.UsageGroupBody,
                group=g.key,
                jobs=g.figures.jobs,
                device_hours=acct.hours(g.figures.held_seconds),
                share=acct.share(g.figures, w.total),
                **known(g.figures),
            )
            for g in w.groups
        ],
        total=_new(
            wire.UsageTotal,
            jobs=w.total.jobs,
            device_hours=acct.hours(w.total.held_seconds),
            **known(w.total),
        ),
        more=w.more or None,
    )
