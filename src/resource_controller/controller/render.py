"""Rendering: store records into the wire models routes answer with.

Every age is measured here, on the controller's clock.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any, TypeVar

import pydantic

from resource_controller import wire
from resource_controller.core.states import DeviceState
from resource_controller.core.waiting import Blocker
from resource_controller.store.records import DeviceRecord, DeviceSnapshot, JobRecord, LabelRecord

ZERO_INSTANT = "0001-01-01T00:00:00Z"

M = TypeVar("M", bound=pydantic.BaseModel)


def _new(model: type[M], **fields: Any) -> M:
    """A response model built without validation: its fields come from the store's typed
    records, and ``/v1/state`` at 10,000 devices builds some 20,000 of them (validation
    was 70 % of rendering it). ``tests/controller/test_render.py`` holds every builder
    here to what validation would accept and serialize."""
    return model.model_construct(**fields)


@functools.lru_cache(maxsize=8192)
def ts(seconds: int | None) -> str | None:
    """RFC 3339 UTC with a Z, whole seconds (API-004); None stays None.

    Cached: a fleet's heartbeats and a queue's submits fall on few distinct seconds, and
    ``/v1/state`` formats four instants per device and per job.
    """
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(j: JobRecord) -> wire.Job:
    """The Job object (API-020): empty and zero fields become omitted."""
    return _new(
        wire.Job,
        id=j.id,
        selector=j.selector,
        kind=j.kind,
        command=j.command,
        cwd=j.cwd,
        env=j.env or None,
        submitter=j.submitter,
        idempotency_key=j.idempotency_key or None,
        priority=j.priority,
        max_runtime_seconds=j.max_runtime or None,
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
    )


def label(lb: LabelRecord) -> wire.Label:
    return _new(
        wire.Label, key=lb.key, value=lb.value, source=lb.source, updated_at=ts(lb.updated_at) or ""
    )


def device(d: DeviceRecord, labels: list[LabelRecord]) -> wire.Device:
    return _new(
        wire.Device,
        id=d.id,
        host=d.host,
        name=d.name,
        worker_id=d.worker_id,
        state=d.state,
        last_heartbeat_at=ts(d.last_heartbeat_at) or "",
        labels=[label(lb) for lb in labels] or None,
        max_runtime_seconds=d.max_runtime,  # EXT-CLI-6: the ceiling is visible, 0 when none
        **drain_fields(d),
    )


def drain_fields(d: DeviceRecord) -> dict[str, Any]:
    """EXT-DRAIN-3a: ``draining`` only when true; who, when and why only while draining
    and non-empty."""
    if not d.draining:
        return {}
    return {
        "draining": True,
        "drained_by": d.drained_by or None,
        "drained_at": ts(d.drained_at) if d.drained_at else None,
        "drain_reason": d.drain_reason or None,
    }


def quarantine_text(d: DeviceRecord) -> str | None:
    """The detail when there is one, else the category; only for unhealthy devices (STORE-033)."""
    if d.state != DeviceState.UNHEALTHY:
        return None
    return d.quarantine_detail or d.quarantine_reason or None


def device_view(s: DeviceSnapshot, now: int) -> wire.DeviceView:
    """The device view (API-023)."""
    lease = s.lease
    return _new(
        wire.DeviceView,
        device=device(s.device, s.labels),
        holder=lease.holder if lease else None,
        job_id=(lease.job_id or None) if lease else None,
        kind=lease.kind if lease else None,
        reason=(lease.reason or None) if lease else None,
        command=s.command if lease else None,
        elapsed_seconds=now - lease.acquired_at if lease else 0,
        heartbeat_age_seconds=now - s.device.last_heartbeat_at,
        oldest_label_age_seconds=(
            now - min(lb.updated_at for lb in s.labels) if s.labels else None
        ),
        quarantine_reason=quarantine_text(s.device),
    )


def waiting_for(blockers: list[Blocker]) -> list[wire.WaitingFor]:
    """A queued job's ``waiting_for`` (EXT-WHY-1a): empty and absent facts are omitted."""
    return [
        _new(
            wire.WaitingFor,
            device_id=b.device_id,
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
        )
        for b in blockers
    ]
