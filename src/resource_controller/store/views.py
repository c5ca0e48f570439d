"""Reads that join several tables for the fleet views, describe and explain."""

from __future__ import annotations

import json
from dataclasses import dataclass

from resource_controller.core import scheduling, selectors, share, waiting
from resource_controller.core.scheduling import JobSnap
from resource_controller.core.states import DeviceState, JobState
from resource_controller.store import after, fleet, jobs, passes, queries, sql
from resource_controller.store.records import (
    DeviceRecord,
    DeviceSnapshot,
    JobRecord,
    LabelRecord,
    LeaseRecord,
    RecoveryHistory,
)

_LEASE_FIELDS = list(LeaseRecord._fields)
_lease = LeaseRecord._make
_snapshot = DeviceSnapshot._make
#: A plain string: compared once per device (an enum member costs four times as much).
_UNHEALTHY = DeviceState.UNHEALTHY.value
_HELD = (
    f"SELECT {', '.join('leases.' + n for n in _LEASE_FIELDS)}, jobs.command FROM leases"
    " LEFT JOIN jobs ON jobs.id = leases.job_id WHERE leases.released_at IS NULL"
)
_HELD_ONLY = (
    f"SELECT {', '.join('leases.' + n for n in _LEASE_FIELDS)} FROM leases"
    " WHERE leases.released_at IS NULL"
)


def devices(
    conn: queries.Conn,
    device_id: str | None = None,
    commands: dict[str, list[str]] | None = None,
    kept: fleet.FleetSnapshot | None = None,
) -> list[DeviceSnapshot]:
    """Every device (or one) with its labels and live lease, ordered by ID.

    Plain SQL on the driver's connection: ``/v1/state`` and ``/v1/devices`` read the
    whole fleet, and SQLAlchemy's row handling was most of that read at 10,000 devices.
    The whole fleet's records and labels come from ``kept`` (the store's snapshot, which
    rereads only what changed; a fresh one when none is given). ``commands`` (job ID to
    command, every active job's) spares decoding each holder's command again when the
    caller has read the active jobs anyway.
    """
    db = conn
    held_sql = _HELD_ONLY if commands is not None else _HELD
    if device_id is None:
        rows, labels = (kept or fleet.FleetSnapshot()).current(db)
        held_rows = db.execute(held_sql)
    else:
        found = queries.device(db, device_id)
        rows = [found] if found else []
        labels = fleet.label_rows(db, [device_id])
        held_rows = db.execute(held_sql + " AND leases.device_id = ?", (device_id,))
    held: dict[str, tuple[LeaseRecord, list[str] | None]] = {}
    for r in held_rows:
        if commands is not None:
            lease = _lease(r)
            command = commands.get(lease.job_id)
        else:
            lease = _lease(r[:-1])
            command = json.loads(r[-1]) if r[-1] else None
        held[lease.device_id] = (lease, command)
    none = (None, None)
    no_labels: list[LabelRecord] = []
    return [_snapshot((d, labels.get(d.id, no_labels), *held.get(d.id, none))) for d in rows]


@dataclass(frozen=True)
class Sheet:
    body: str
    updated_at: int | None
    host_wide: bool


def sheet_for(conn: queries.Conn, device: DeviceRecord) -> Sheet:
    """The device's own usage sheet, or the host-wide one when its body is empty."""

    def read(device_id: str) -> tuple[str, int | None]:
        r = conn.one(
            "SELECT body, updated_at FROM host_docs WHERE host = ? AND device_id = ?",
            (device.host, device_id),
        )
        return (r[0], r[1]) if r else ("", None)

    body, at = read(device.id)
    if body:
        return Sheet(body, at, False)
    body, at = read("")
    return Sheet(body, at, True)


def recent_jobs(conn: queries.Conn, device_id: str, n: int = 5) -> list[JobRecord]:
    return jobs.list_jobs(conn, n, device=device_id)


@dataclass(frozen=True)
class Description:
    """What describe shows for one device, plus its flap-guard history."""

    snapshot: DeviceSnapshot
    sheet: Sheet
    recent_jobs: list[JobRecord]
    recoveries: RecoveryHistory


@dataclass(frozen=True)
class Explanation:
    selector: str
    matching: list[str]
    free: list[str]
    queue_depth: int
    #: When nothing matches, what the devices have for the selector's keys; else "".
    hint: str = ""


def explain(conn: queries.Conn, text: str, kept: fleet.FleetSnapshot | None = None) -> Explanation:
    """What a selector would match right now, from one snapshot: ``kept``, the
    store's, when given."""
    parsed = selectors.parse(text)
    _, snaps = (kept or fleet.FleetSnapshot()).read(conn)
    matching = scheduling.matching(parsed, snaps)
    ids = {d.id for d in matching}
    depth = sum(scheduling.competes(j.snap(), ids, snaps) for j in jobs.queued(conn))
    return Explanation(
        selector=text,
        matching=sorted(ids),
        free=[d.id for d in matching if d.schedulable],
        queue_depth=depth,
        hint="" if ids else selectors.no_match_hint(parsed, [d.labels for d in snaps]),
    )


_HOLDINGS = (
    "SELECT leases.device_id, leases.holder, leases.job_id, leases.kind, leases.reason,"
    " leases.acquired_at, leases.expires_at, jobs.max_runtime_seconds FROM leases"
    " LEFT JOIN jobs ON jobs.id = leases.job_id WHERE leases.released_at IS NULL"
)


def wait_snapshot(
    conn: queries.Conn,
    queued: list[JobSnap],
    kept: fleet.FleetSnapshot | None = None,
    limits: share.SubmitterLimits = share.NO_LIMITS,
    order: dict[str, tuple[str, ...]] | None = None,
) -> waiting.Snapshot:
    """What the why-rules read, in three queries however long the queue.

    Devices with their effective labels (from ``kept``, the store's snapshot, when
    given), every live lease with its job's effective runtime (``None`` for a lease no
    job row backs), the reservation rows of the last pass, and the quarantine text of
    unhealthy devices as the device view shows it (API-023: the detail when there is
    one, else the category). With EXT-SHARE: the devices each share name holds when a
    limit applies, and, for the queued jobs that wait for others, those not yet ended,
    in the order of ``order`` (job -> its ``after_ids``).
    """
    db = conn
    records, snaps = (kept or fleet.FleetSnapshot()).read(db)
    holdings = [
        waiting.Holding(
            device_id=device_id,
            holder=holder,
            job_id=job_id,
            kind=kind,
            reason=reason,
            acquired_at=acquired_at,
            expires_at=expires_at,
            runtime=runtime if job_id and runtime is not None else None,
        )
        for device_id, holder, job_id, kind, reason, acquired_at, expires_at, runtime in (
            db.execute(_HOLDINGS)
        )
    ]
    reservations = dict(db.execute("SELECT device_id, job_id FROM reservations").fetchall())
    quarantine = {
        d.id: d.quarantine_detail or d.quarantine_reason
        for d in records.values()
        if d.state == _UNHEALTHY
    }
    held = passes.held_by_share(db) if limits.on else {}
    waiting_jobs = [j.id for j in queued if j.after_open]
    pending = after.pending(db, waiting_jobs) if waiting_jobs else {}
    for job_id, ids in pending.items():
        given = (order or {}).get(job_id, ())
        ids.sort(key=lambda i: given.index(i) if i in given else len(given))
    return waiting.Snapshot(
        snaps, queued, holdings, reservations, quarantine, limits, held, pending
    )


def waiting_for(
    conn: queries.Conn,
    job: JobRecord,
    key: scheduling.QueueKey = scheduling.queue_key,
    kept: fleet.FleetSnapshot | None = None,
    limits: share.SubmitterLimits = share.NO_LIMITS,
) -> list[waiting.Blocker]:
    """What one queued job waits for; ``[]`` for a job not queued. ``key`` is
    the queue order that decides who is ahead (aged); ``limits`` the
    submitter limits."""
    if not job.queued:
        return []
    # Of the rest of the queue, the rules read only whether a job reserving a candidate
    # is ahead of this one: the reservers are all they need, however long the queue.
    queued = [job.snap(), *(s for s in queries.queued_snaps(conn, True) if s.id != job.id)]
    snap = wait_snapshot(conn, queued, kept, limits, {job.id: job.after_ids})
    return waiting.waiting_for(job.snap(), snap, key)


def waiting_for_all(
    conn: queries.Conn,
    queued: list[JobRecord],
    key: scheduling.QueueKey = scheduling.queue_key,
    kept: fleet.FleetSnapshot | None = None,
    limits: share.SubmitterLimits = share.NO_LIMITS,
) -> dict[str, list[waiting.Blocker]]:
    """What every queued job waits for, from one snapshot (``/v1/state``)."""
    if not queued:
        return {}
    order = {j.id: j.after_ids for j in queued if j.after_open}
    snap = wait_snapshot(conn, [j.snap() for j in queued], kept, limits, order)
    return waiting.waiting_for_all(snap, key)


def active_job_on(conn: queries.Conn, device_id: str) -> str:
    """The newest assigned/running job on a device, or ''; for fault events."""
    on, params = queries.on_device(device_id)
    found = conn.value(
        f"SELECT id FROM jobs WHERE {on} AND state IN (?, ?)"
        " ORDER BY submitted_at DESC, seq DESC LIMIT 1",
        (*params, str(JobState.ASSIGNED), str(JobState.RUNNING)),
    )
    return str(found) if found else ""


# ---- post-sweep reads (store.md §21): run after the sweep committed, never inside it ----


def quarantine_column(conn: queries.Conn, ids: list[str], column: str) -> dict[str, str]:
    """Device ID -> current ``quarantine_reason`` or ``quarantine_detail`` for every ID
    with a row; IDs without a row are absent."""
    if not ids:
        return {}
    if column not in _QUARANTINE_COLUMNS:
        raise ValueError(f"not a quarantine column: {column!r}")
    rows = conn.execute(f"SELECT id, {column} FROM devices WHERE {queries.id_in(len(ids))}", ids)
    return {str(r[0]): str(r[1]) for r in rows}


_QUARANTINE_COLUMNS = frozenset({"quarantine_reason", "quarantine_detail"})


def lease_devices(conn: queries.Conn, ids: list[str]) -> dict[str, str]:
    """Lease or job ID -> device, from live or released lease rows.

    ``leases_expired`` holds job IDs or lease IDs, and the released lease row is the
    only remaining link to the device just quarantined. Rows are applied oldest
    ``acquired_at`` first, so the newest wins.
    """
    if not ids:
        return {}
    out: dict[str, str] = {}
    marks = sql.marks(len(ids))
    rows = conn.execute(
        f"SELECT id, job_id, device_id FROM leases WHERE id IN ({marks}) OR job_id IN ({marks})"
        " ORDER BY acquired_at, id",
        (*ids, *ids),
    )
    for lease_id, job_id, device_id in rows:
        out[lease_id] = device_id
        if job_id:
            out[job_id] = device_id
    return out
