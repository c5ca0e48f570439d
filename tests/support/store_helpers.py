"""Store reads and writes that only tests (and the benches) make.

The controller never calls these, so they live beside the tests rather than in the
store: each is one transaction of the store's core (``Store.tx``: its lock, crash points
and error mapping), exactly as an aggregate's operation would run it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from resource_controller import errors
from resource_controller.store import engine, jobs, leases, queries, reports, schema, views
from resource_controller.store.facade import Store
from resource_controller.store.records import (
    DeviceRecord,
    DeviceRecoveries,
    JobRecord,
    LeaseRecord,
    split_ids,
)


@dataclass(frozen=True)
class Release:
    """Outcome of a terminal report: the job as it is now, and whether it already was
    terminal."""

    job: JobRecord
    was_terminal: bool


def job_with_position(store: Store, job_id: str) -> tuple[JobRecord, int]:
    """The job and its 1-based queue position (0 once it left the queue)."""
    job, position, _ = store.queue.job_view(job_id)
    return job, position


def mark_running(store: Store, job_id: str) -> None:
    """The worker's ``running`` report without its checks (STORE-080)."""
    with store.tx("running") as c:
        reports.mark_running(c, store.now(), job_id)


def release(
    store: Store, job_id: str, state: str, exit_code: int | None = None, reason: str = ""
) -> Release:
    """The worker's terminal report without its checks (STORE-082)."""
    with store.tx("finish") as c:
        job = queries.job(c, job_id)
        reports.release_job(c, store.now(), job, state, exit_code, reason)
        return Release(queries.job(c, job_id), job.terminal)


def recovery_history(store: Store, device_id: str) -> DeviceRecoveries:
    """Automatic recoveries inside the sliding hour, newest first (STORE-123)."""
    with store.tx() as c:
        return views.recovery_history(c, store.now(), device_id)


def quarantine_details(store: Store, ids: list[str]) -> dict[str, str]:
    """Each device's quarantine detail (STORE-170)."""
    return {d.id: d.quarantine_detail for d in devices(store) if d.id in ids}


def device(store: Store, device_id: str) -> DeviceRecord | None:
    with store.tx() as c:
        return queries.device(c, device_id)


def devices(store: Store) -> list[DeviceRecord]:
    with store.tx() as c:
        return queries.all_devices(c)


def live_leases(store: Store) -> list[LeaseRecord]:
    """Live leases, oldest first."""
    with store.tx() as c:
        text = f"SELECT {', '.join(LeaseRecord._fields)} FROM leases"
        return [
            LeaseRecord._make(r)
            for r in c.all(text + " WHERE released_at IS NULL ORDER BY acquired_at")
        ]


def allocate_directly(
    store: Store, device_id: str, submitter: str, ttl: int = 0, key: str = ""
) -> JobRecord:
    """Mark a ready device busy under a new assigned job (STORE-069): a test fixture, so
    it lives here, where no API can reach it."""
    with store.tx() as c:
        now = store.now()
        if key:
            existing = c.value("SELECT id FROM jobs WHERE idempotency_key = ?", (key,))
            if existing:
                return queries.job(c, existing)
        dev = queries.device(c, device_id)
        if dev is None or dev.state != "ready":
            raise errors.NoDeviceAvailable(f"{device_id} is not ready")
        new = jobs.NewJob(
            command=["fixture"], submitter=submitter, device_id=device_id, idempotency_key=key
        )
        job = jobs.enqueue(c, now, new, lambda: [])
        c.execute("UPDATE jobs SET queued_at = 0, max_runtime_seconds = 0 WHERE id = ?", (job.id,))
        outcome = leases.assign(c, now, job, dev)
        assert outcome == "placed", outcome
        # The fixture's deadline is its own TTL, whatever the device's ceiling (STORE-052).
        c.execute(
            "UPDATE leases SET expires_at = ? WHERE job_id = ?",
            (now + (ttl if ttl > 0 else leases.NO_RUNTIME_TTL), job.id),
        )
        return queries.job(c, job.id)


def _by_name(store: Store, table: sa.Table, order: sa.Column[Any]) -> list[dict[str, Any]]:
    """Every row of ``table`` as a column-name mapping, through SQLAlchemy on a connection
    of its own: the reference the store's positional reads are held to."""
    eng = engine.create_engine(store.database.target)
    try:
        with eng.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(order))]
    finally:
        eng.dispose()


def jobs_by_name(store: Store) -> list[JobRecord]:
    """Every job, built from its row by column name (epochs 0), in ``seq`` order."""
    out = []
    for m in _by_name(store, schema.jobs, schema.jobs.c.seq):
        m["command"] = json.loads(m["command"])
        m["env"] = json.loads(m["env"]) if m["env"] else {}
        m["device_ids"] = split_ids(m["device_ids"] or "")
        m["after_ids"] = split_ids(m["after_ids"] or "")
        m["avoid_device_ids"] = split_ids(m["avoid_device_ids"] or "")
        out.append(JobRecord(**m, lease_epoch=0))
    return out


def devices_by_name(store: Store) -> list[DeviceRecord]:
    """Every device, built from its row by column name, in ID order."""
    return [DeviceRecord(**m) for m in _by_name(store, schema.devices, schema.devices.c.id)]
