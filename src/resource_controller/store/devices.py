"""Workers and devices: registration, heartbeats, labels, sheets and operator actions.

Registration means "a fresh worker process with nothing running" (STORE-110/111):
whatever the controller still thinks is in flight on that worker is settled here,
and the devices that backed it are quarantined unless the host's boot ID changed
(a reboot proves nothing survived). Silence is never proof: no path in this module
makes an occupied-looking device ``ready`` without one of the proofs the spec lists.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import sqlalchemy as sa

from resource_controller import errors
from resource_controller.core import expiry
from resource_controller.core.states import (
    ACTIVE,
    REASON_HOST_REBOOTED,
    REASON_REREGISTERED,
    RECOVERABLE,
    DeviceState,
    JobState,
    Quarantine,
)
from resource_controller.core.transitions import DEVICE, JOB, Op
from resource_controller.store import leases, moves, queries
from resource_controller.store import schema as t
from resource_controller.store.records import (
    AutoRecovery,
    Recovered,
    RecoveryEntry,
    RecoveryHistory,
    Registration,
)

_ACTIVE = tuple(s.value for s in ACTIVE)
_RECOVERABLE = tuple(r.value for r in RECOVERABLE)


def worker_id_for(host: str) -> str:
    """UUIDv5 of the host in the DNS namespace: a restarted worker resumes its own devices."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, host))


def _has_live_lease(device_id: str) -> sa.ColumnElement[bool]:
    return sa.exists().where(t.leases.c.device_id == device_id, t.leases.c.released_at.is_(None))


def _quarantine(conn: sa.Connection, device_id: str, reason: str) -> None:
    """Make a device unhealthy with ``reason``, keeping the reason of one already unhealthy (STORE-031)."""
    moves.move_core(
        conn,
        DEVICE,
        Op.REAP,
        t.devices.c.id == device_id,
        state=DeviceState.UNHEALTHY,
        quarantine_reason=reason,
        quarantine_detail="",
    )


def register(
    conn: sa.Connection,
    now: int,
    host: str,
    boot_id: str,
    declared: list[tuple[str, int]],
) -> Registration:
    """Upsert the worker, reap its in-flight jobs, declare its devices and their ceilings (STORE-110..112)."""
    worker_id = worker_id_for(host)
    w = t.workers.c
    stored = conn.execute(sa.select(w.boot_id).where(w.id == worker_id)).scalar()
    reboot = bool(stored) and bool(boot_id) and stored != boot_id
    if stored is None:
        conn.execute(
            sa.insert(t.workers).values(
                id=worker_id, host=host, boot_id=boot_id, last_heartbeat_at=now
            )
        )
    else:
        conn.execute(
            sa.update(t.workers)
            .where(w.id == worker_id)
            .values(host=host, boot_id=boot_id, last_heartbeat_at=now)
        )
    reaped = _reap(conn, now, worker_id, reboot)
    d = t.devices.c
    if reboot:
        # A host down longer than the write-off has nothing in flight left to key off;
        # the reboot itself proves its devices are empty (STORE-110 step 4).
        moves.move_core(
            conn,
            DEVICE,
            Op.REBOOT_RECOVER,
            d.worker_id == worker_id,
            d.quarantine_reason.in_(_RECOVERABLE),
            ~_has_live_lease_col(),
            state=DeviceState.READY,
            quarantine_reason="",
            quarantine_detail="",
        )
    for name, max_runtime in declared:
        device_id = f"{host}:{name}"
        existing = queries.device(conn, device_id)
        if existing is None:
            moves.create_core(
                conn,
                DEVICE,
                Op.REGISTER_NEW,
                {
                    "id": device_id,
                    "host": host,
                    "name": name,
                    "worker_id": worker_id,
                    "state": DeviceState.READY,
                    "last_heartbeat_at": now,
                    "max_runtime": max(0, int(max_runtime)),
                },
            )
            continue
        values: dict[str, object] = {
            "worker_id": worker_id,
            "last_heartbeat_at": now,
            "max_runtime": max(0, int(max_runtime)),
        }
        # An unhealthy device keeps its state and reason; any other returns to ready.
        if not moves.move_core(
            conn,
            DEVICE,
            Op.REDECLARE,
            d.id == device_id,
            state=DeviceState.READY,
            quarantine_reason="",
            **values,
        ):
            conn.execute(sa.update(t.devices).where(d.id == device_id).values(**values))
    return Registration(worker_id=worker_id, reboot_proof=reboot, reaped=reaped)


def _has_live_lease_col() -> sa.ColumnElement[bool]:
    return sa.exists().where(
        t.leases.c.device_id == t.devices.c.id, t.leases.c.released_at.is_(None)
    )


def _reap(conn: sa.Connection, now: int, worker_id: str, reboot: bool) -> list[str]:
    """End the worker's in-flight jobs as ``lost`` and settle their devices (STORE-111)."""
    j = t.jobs.c
    reaped = queries.jobs_where(conn, j.worker_id == worker_id, j.state.in_(_ACTIVE))
    reason = REASON_HOST_REBOOTED if reboot else REASON_REREGISTERED
    for job in reaped:
        moves.move_core(
            conn,
            JOB,
            Op.REAP,
            j.id == job.id,
            state=JobState.LOST,
            kill_reason=reason,
            finished_at=now,
        )
        devices = set(leases.release_for_job(conn, now, job.id)) | set(job.devices)
        for device_id in sorted(devices):
            if reboot:
                moves.move_core(
                    conn,
                    DEVICE,
                    Op.REAP_REBOOT,
                    t.devices.c.id == device_id,
                    state=DeviceState.READY,
                    quarantine_reason="",
                    quarantine_detail="",
                )
            else:
                _quarantine(conn, device_id, Quarantine.REGISTRATION)
    return [job.id for job in reaped]


def worker_host(conn: sa.Connection, worker_id: str) -> str:
    """The registered host of a worker; ``WorkerNotFound`` when unknown (STORE-132)."""
    host = conn.execute(sa.select(t.workers.c.host).where(t.workers.c.id == worker_id)).scalar()
    if host is None:
        raise errors.WorkerNotFound(f"no such worker: {worker_id}")
    return str(host)


def apply_facts(
    conn: sa.Connection,
    now: int,
    host: str,
    names: list[str],
    labels: Mapping[str, Mapping[str, str]] | None,
    declared: Mapping[str, Mapping[str, str]] | None,
    sheet: str | None,
    device_sheets: Mapping[str, str] | None,
) -> None:
    """Store labels and usage sheets for the named devices (STORE-141..144, STORE-153)."""
    for source, facts in (("detected", labels), ("declared", declared)):
        if facts is None:
            continue
        host_wide = dict(facts.get("", {}))
        for name in names:
            if name in facts:
                _replace_labels(conn, now, f"{host}:{name}", source, host_wide | dict(facts[name]))
    if sheet is not None:
        _upsert_doc(conn, now, host, "", sheet)
    for name in names:
        if device_sheets is not None and name in device_sheets:
            _upsert_doc(conn, now, host, f"{host}:{name}", device_sheets[name])


def _replace_labels(
    conn: sa.Connection, now: int, device_id: str, source: str, pairs: dict[str, str]
) -> None:
    dl = t.device_labels.c
    conn.execute(sa.delete(t.device_labels).where(dl.device_id == device_id, dl.source == source))
    if pairs:
        conn.execute(
            sa.insert(t.device_labels),
            [
                {"device_id": device_id, "key": k, "value": v, "source": source, "updated_at": now}
                for k, v in pairs.items()
            ],
        )


def _upsert_doc(conn: sa.Connection, now: int, host: str, device_id: str, body: str) -> None:
    h = t.host_docs.c
    conn.execute(sa.delete(t.host_docs).where(h.host == host, h.device_id == device_id))
    conn.execute(
        sa.insert(t.host_docs).values(host=host, device_id=device_id, body=body, updated_at=now)
    )


def clear(conn: sa.Connection, device_id: str) -> bool:
    """An operator returns an unhealthy, unleased device to the pool (STORE-130)."""
    done = moves.move_core(
        conn,
        DEVICE,
        Op.CLEAR,
        t.devices.c.id == device_id,
        ~_has_live_lease(device_id),
        state=DeviceState.READY,
        quarantine_reason="",
        quarantine_detail="",
    )
    return done == 1


def set_state(conn: sa.Connection, now: int, device_id: str, state: str, detail: str) -> None:
    """The host's own report; ``unhealthy`` is a ``fault`` that overwrites any reason (STORE-131)."""
    values: dict[str, object] = {"last_heartbeat_at": now}
    if state == DeviceState.UNHEALTHY:
        op = Op.FAULT
        values |= {"quarantine_reason": Quarantine.FAULT, "quarantine_detail": detail}
    else:
        op = Op.HOST_REPORT
        values |= {"quarantine_reason": "", "quarantine_detail": ""}
    done = moves.move_core(conn, DEVICE, op, t.devices.c.id == device_id, state=state, **values)
    if done == 0:
        raise errors.DeviceNotFound(f"no such device: {device_id}")


def retire(conn: sa.Connection, device_id: str) -> None:
    """Remove a device and everything keyed to it except job history (STORE-133)."""
    if queries.device(conn, device_id) is None:
        raise errors.DeviceNotFound(f"no such device: {device_id}", code="device_not_found")
    if conn.execute(sa.select(_has_live_lease(device_id))).scalar():
        raise errors.DeviceBusy(f"a live lease holds {device_id}: kill or release it first")
    conn.execute(sa.delete(t.device_labels).where(t.device_labels.c.device_id == device_id))
    conn.execute(sa.delete(t.host_docs).where(t.host_docs.c.device_id == device_id))
    conn.execute(sa.delete(t.reservations).where(t.reservations.c.device_id == device_id))
    conn.execute(sa.delete(t.leases).where(t.leases.c.device_id == device_id))
    moves.remove_core(conn, DEVICE, Op.RETIRE, t.devices.c.id == device_id)


def drain(conn: sa.Connection, now: int, device_id: str, by: str, reason: str) -> None:
    """Flag a device draining (EXT-DRAIN-2): what it runs finishes, nothing new is placed.

    Not a state: the device keeps its state, its lease and its place for selectors and
    pinned submits. Draining again replaces who, when and why. ``DeviceNotFound`` for
    an unknown device.
    """
    done = conn.execute(
        sa.update(t.devices)
        .where(t.devices.c.id == device_id)
        .values(draining=1, drained_by=by, drained_at=now, drain_reason=reason)
    ).rowcount
    if done == 0:
        raise errors.DeviceNotFound(f"no such device: {device_id}")
    # A reservation is a claim to be placed next; a draining device is never reserved.
    conn.execute(sa.delete(t.reservations).where(t.reservations.c.device_id == device_id))


def undrain(conn: sa.Connection, device_id: str) -> None:
    """Clear the drain flag and its who/when/why; a device not draining is left as it is."""
    if queries.device(conn, device_id) is None:
        raise errors.DeviceNotFound(f"no such device: {device_id}")
    conn.execute(
        sa.update(t.devices)
        .where(t.devices.c.id == device_id, t.devices.c.draining != 0)
        .values(draining=0, drained_by="", drained_at=0, drain_reason="")
    )


def auto_recover(
    conn: sa.Connection, now: int, worker_id: str, proof: expiry.Proof | None
) -> AutoRecovery:
    """Return this worker's recoverable quarantines to the pool on a valid proof (STORE-121).

    Candidates: the worker's own ``unhealthy`` devices whose reason is recoverable
    (``worker_lost``, ``lease_expired``, ``registration``) and that hold no live lease,
    in device-ID order. Never ``fault`` (the host said the hardware is unfit), never
    ``''`` (cause unknown), never another worker's device. Each candidate is judged by
    the flap guard (STORE-122): at most 3 automatic recoveries per sliding hour, then
    it waits for a person. *Why: repeated quarantine-and-return cycles signal a real
    fault that automatic looping would hide.*
    """
    if proof is None or not proof.proves_clean:
        return AutoRecovery()
    d, r = t.devices.c, t.device_recoveries.c
    candidates = conn.execute(
        sa.select(d.id, d.quarantine_reason)
        .where(
            d.worker_id == worker_id,
            d.state == DeviceState.UNHEALTHY,
            d.quarantine_reason.in_(_RECOVERABLE),
            ~_has_live_lease_col(),
        )
        .order_by(d.id)
    ).all()
    recovered: list[Recovered] = []
    held_back: list[str] = []
    for device_id, reason in candidates:
        # Pruning is lazy: only devices being considered lose their old rows.
        conn.execute(
            sa.delete(t.device_recoveries).where(
                r.device_id == device_id, r.at < expiry.flap_cutoff(now)
            )
        )
        recent = conn.execute(
            sa.select(sa.func.count()).where(r.device_id == device_id)
        ).scalar_one()
        if not expiry.flap_allows(int(recent)):
            held_back.append(device_id)
            continue
        done = moves.move_core(
            conn,
            DEVICE,
            Op.AUTO_RECOVER,
            d.id == device_id,
            state=DeviceState.READY,
            quarantine_reason="",
            quarantine_detail="",
        )
        if done != 1:
            continue
        conn.execute(
            sa.insert(t.device_recoveries).values(device_id=device_id, at=now, reason=reason)
        )
        recovered.append(Recovered(device_id=device_id, reason=reason))
    return AutoRecovery(recovered=recovered, held_back=held_back)


def recovery_history(conn: sa.Connection, now: int, device_id: str) -> RecoveryHistory:
    """The device's automatic recoveries inside the window, newest first (STORE-123).

    Filters by the window itself rather than trusting pruning, which only happens for
    devices being considered for recovery. An unknown device has an empty history.
    """
    r = t.device_recoveries.c
    rows = conn.execute(
        sa.select(r.at, r.reason)
        .where(r.device_id == device_id, r.at >= expiry.flap_cutoff(now))
        .order_by(r.at.desc(), r.reason)
    ).all()
    return RecoveryHistory(
        recoveries=[RecoveryEntry(at=int(at), reason=reason) for at, reason in rows],
        remaining=expiry.flap_remaining(len(rows)),
        limit=expiry.FLAP_LIMIT,
        window=expiry.FLAP_WINDOW,
    )
