"""Store reads and writes that only tests (and the benches) make.

The controller never calls these, so they live beside the tests rather than on
``Store``: each is one transaction on the store's own lock, crash points and error
mapping (``Store._tx`` / ``Store._fast_tx``), exactly as a ``Store`` method would run it.
"""

from __future__ import annotations

import sqlalchemy as sa

from resource_controller import errors
from resource_controller.store import devices as device_ops
from resource_controller.store import jobs, leases, queries, schema, views
from resource_controller.store.facade import Store
from resource_controller.store.records import (
    DeviceRecord,
    JobRecord,
    LeaseRecord,
    RecoveryHistory,
    Release,
)


def job_with_position(store: Store, job_id: str) -> tuple[JobRecord, int]:
    """The job and its 1-based queue position (0 once it left the queue)."""
    with store._tx() as c:
        job = queries.job(c, job_id)
        return job, jobs.queue_position(c, job, store.now(), store.aging)


def mark_running(store: Store, job_id: str) -> None:
    """The worker's ``running`` report without its checks (STORE-080)."""
    with store._fast_tx("running") as c:
        jobs.mark_running(c, store.now(), job_id)


def release(
    store: Store, job_id: str, state: str, exit_code: int | None = None, reason: str = ""
) -> Release:
    """The worker's terminal report without its checks (STORE-082)."""
    with store._fast_tx("finish") as c:
        return jobs.release(c, store.now(), job_id, state, exit_code, reason)


def recovery_history(store: Store, device_id: str) -> RecoveryHistory:
    """Automatic recoveries inside the sliding hour, newest first (STORE-123)."""
    with store._tx() as c:
        return device_ops.recovery_history(c, store.now(), device_id)


def quarantine_details(store: Store, ids: list[str]) -> dict[str, str]:
    """Each device's quarantine detail (STORE-170)."""
    with store._tx() as c:
        return views.quarantine_column(c, ids, "quarantine_detail")


def device(store: Store, device_id: str) -> DeviceRecord | None:
    with store._tx() as c:
        return queries.device(c, device_id)


def devices(store: Store) -> list[DeviceRecord]:
    with store._tx() as c:
        return queries.all_devices(c)


def live_leases(store: Store) -> list[LeaseRecord]:
    with store._tx() as c:
        return leases.live(c)


def allocate_directly(
    store: Store, device_id: str, submitter: str, ttl: int = 0, key: str = ""
) -> JobRecord:
    """Mark a ready device busy under a new assigned job (STORE-069): a test fixture, so
    it lives here, where no API can reach it."""
    with store._tx() as c:
        now = store.now()
        if key:
            existing = c.execute(
                sa.select(schema.jobs.c.id).where(schema.jobs.c.idempotency_key == key)
            ).first()
            if existing:
                return queries.job(c, existing.id)
        dev = queries.device(c, device_id)
        if dev is None or dev.state != "ready":
            raise errors.NoDeviceAvailable(f"{device_id} is not ready")
        job = jobs.enqueue(
            c,
            now,
            jobs.NewJob(
                command=["fixture"],
                submitter=submitter,
                device_id=device_id,
                idempotency_key=key,
            ),
        )
        c.execute(
            sa.update(schema.jobs)
            .where(schema.jobs.c.id == job.id)
            .values(queued_at=0, max_runtime=0)
        )
        outcome = leases.assign(c, now, job, dev)
        assert outcome == "assigned", outcome
        # The fixture's deadline is its own TTL, whatever the device's ceiling (STORE-052).
        c.execute(
            sa.update(schema.leases)
            .where(schema.leases.c.job_id == job.id)
            .values(expires_at=now + (ttl if ttl > 0 else leases.NO_RUNTIME_TTL))
        )
        return queries.job(c, job.id)
