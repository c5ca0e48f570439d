"""Workers and devices: registration, heartbeats, labels, sheets and operator actions.

Registration means "a fresh worker process with nothing running":
whatever the controller still thinks is in flight on that worker is settled here,
and the devices that backed it are quarantined unless the host's boot ID changed
(a reboot proves nothing survived). Silence is never proof: no path in this module
makes an occupied-looking device ``ready`` without one of the proofs the spec lists.

A registration that declares ``gpu0.mig0`` where the host had ``gpu0`` (or the reverse:
a GPU put in or out of MIG mode) leaves the old name's row, as it leaves
every undeclared device; but that row stands for the same silicon, so it is marked with
the detected label ``mig_conflict`` and never granted again until a registration
declares it once more.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from resource_controller import errors
from resource_controller.core import expiry, mig
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
from resource_controller.store import leases, moves, queries, sql
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


#: The device of the row at hand holds a live lease.
_LEASED = (
    "EXISTS (SELECT 1 FROM leases WHERE leases.device_id = devices.id"
    " AND leases.released_at IS NULL)"
)
_RECOVERABLE_IN = f"quarantine_reason IN ({sql.marks(len(_RECOVERABLE))})"


def _quarantine(conn: queries.Conn, device_id: str, reason: str) -> None:
    """Make a device unhealthy with ``reason``, keeping the reason of one already unhealthy."""
    moves.move(
        conn,
        DEVICE,
        Op.REAP,
        "id = ?",
        (device_id,),
        state=DeviceState.UNHEALTHY,
        quarantine_reason=reason,
        quarantine_detail="",
    )


def register(
    conn: queries.Conn,
    now: int,
    host: str,
    boot_id: str,
    declared: list[tuple[str, int]],
) -> Registration:
    """Upsert the worker, reap its in-flight jobs, declare its devices and their ceilings."""
    worker_id = worker_id_for(host)
    queries.lock_worker_devices(conn, worker_id)
    stored = conn.value("SELECT boot_id FROM workers WHERE id = ?", (worker_id,))
    reboot = bool(stored) and bool(boot_id) and stored != boot_id
    conn.execute(
        "INSERT INTO workers (id, host, boot_id, last_heartbeat_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET host = excluded.host, boot_id = excluded.boot_id,"
        " last_heartbeat_at = excluded.last_heartbeat_at",
        (worker_id, host, boot_id, now),
    )
    reaped = _reap(conn, now, worker_id, reboot)
    if reboot:
        # A host down longer than the write-off has nothing in flight left to key off;
        # the reboot itself proves its devices are empty.
        moves.move(
            conn,
            DEVICE,
            Op.REBOOT_RECOVER,
            f"worker_id = ? AND {_RECOVERABLE_IN} AND NOT {_LEASED}",
            (worker_id, *_RECOVERABLE),
            state=DeviceState.READY,
            quarantine_reason="",
            quarantine_detail="",
        )
    for name, max_runtime_seconds in declared:
        device_id = f"{host}:{name}"
        existing = queries.device(conn, device_id)
        if existing is None:
            moves.create(
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
                    "max_runtime_seconds": max(0, int(max_runtime_seconds)),
                },
            )
            continue
        values: dict[str, object] = {
            "worker_id": worker_id,
            "last_heartbeat_at": now,
            "max_runtime_seconds": max(0, int(max_runtime_seconds)),
        }
        # An unhealthy device keeps its state and reason; any other returns to ready.
        if not moves.move(
            conn,
            DEVICE,
            Op.REDECLARE,
            "id = ?",
            (device_id,),
            state=DeviceState.READY,
            quarantine_reason="",
            **values,
        ):
            conn.execute(
                "UPDATE devices SET worker_id = ?, last_heartbeat_at = ?, max_runtime_seconds = ?"
                " WHERE id = ?",
                (worker_id, now, values["max_runtime_seconds"], device_id),
            )
    superseded = _mark_superseded(conn, now, host, worker_id, [name for name, _ in declared])
    return Registration(
        worker_id=worker_id, reboot_proof=reboot, reaped=reaped, superseded=superseded
    )


def _mark_superseded(
    conn: queries.Conn, now: int, host: str, worker_id: str, declared: list[str]
) -> dict[str, list[str]]:
    """Mark the host's undeclared devices whose GPU a declared one now stands for.

    Their detected labels become the one ``mig_conflict`` (the stale facts would still
    match selectors); a later registration that declares the name replaces them with
    what the worker reports then.
    """
    rows = conn.all("SELECT name FROM devices WHERE worker_id = ?", (worker_id,))
    existing = [r[0] for r in rows]
    marked: dict[str, list[str]] = {}
    for name, by in mig.superseded(declared, existing).items():
        device_id = f"{host}:{name}"
        _replace_labels(conn, now, device_id, "detected", {mig.CONFLICT: mig.superseded_text(by)})
        marked[device_id] = by
    return marked


def _reap(conn: queries.Conn, now: int, worker_id: str, reboot: bool) -> list[str]:
    """End the worker's in-flight jobs as ``lost`` and settle their devices."""
    reaped = queries.jobs_where(
        conn, f"worker_id = ? AND state IN ({sql.marks(len(_ACTIVE))})", (worker_id, *_ACTIVE)
    )
    reason = REASON_HOST_REBOOTED if reboot else REASON_REREGISTERED
    for job in reaped:
        moves.move(
            conn,
            JOB,
            Op.REAP,
            "id = ?",
            (job.id,),
            state=JobState.LOST,
            kill_reason=reason,
            finished_at=now,
        )
        devices = set(leases.release_for_job(conn, now, job.id)) | set(job.devices)
        for device_id in sorted(devices):
            if reboot:
                moves.move(
                    conn,
                    DEVICE,
                    Op.REAP_REBOOT,
                    "id = ?",
                    (device_id,),
                    state=DeviceState.READY,
                    quarantine_reason="",
                    quarantine_detail="",
                )
            else:
                _quarantine(conn, device_id, Quarantine.REGISTRATION)
    return [job.id for job in reaped]


def worker_host(conn: queries.Conn, worker_id: str) -> str:
    """The registered host of a worker; ``WorkerNotFound`` when unknown."""
    host = conn.value("SELECT host FROM workers WHERE id = ?", (worker_id,))
    if host is None:
        raise errors.WorkerNotFound(f"no such worker: {worker_id}")
    return str(host)


def apply_facts(
    conn: queries.Conn,
    now: int,
    host: str,
    names: list[str],
    labels: Mapping[str, Mapping[str, str]] | None,
    declared: Mapping[str, Mapping[str, str]] | None,
    sheet: str | None,
    device_sheets: Mapping[str, str] | None,
) -> None:
    """Store labels and usage sheets for the named devices."""
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
    conn: queries.Conn, now: int, device_id: str, source: str, pairs: dict[str, str]
) -> None:
    conn.execute(
        "DELETE FROM device_labels WHERE device_id = ? AND source = ?", (device_id, source)
    )
    if pairs:
        conn.many(
            "INSERT INTO device_labels (device_id, key, value, source, updated_at)"
            " VALUES (?, ?, ?, ?, ?)",
            [(device_id, k, v, source, now) for k, v in pairs.items()],
        )


def _upsert_doc(conn: queries.Conn, now: int, host: str, device_id: str, body: str) -> None:
    conn.execute("DELETE FROM host_docs WHERE host = ? AND device_id = ?", (host, device_id))
    conn.execute(
        "INSERT INTO host_docs (host, device_id, body, updated_at) VALUES (?, ?, ?, ?)",
        (host, device_id, body, now),
    )


def clear(conn: queries.Conn, device_id: str) -> bool:
    """An operator returns an unhealthy, unleased device to the pool."""
    done = moves.move(
        conn,
        DEVICE,
        Op.CLEAR,
        f"id = ? AND NOT {_LEASED}",
        (device_id,),
        state=DeviceState.READY,
        quarantine_reason="",
        quarantine_detail="",
    )
    return done == 1


def set_state(conn: queries.Conn, now: int, device_id: str, state: str, detail: str) -> None:
    """The host's own report; ``unhealthy`` is a ``fault`` that overwrites any reason."""
    values: dict[str, object] = {"last_heartbeat_at": now}
    if state == DeviceState.UNHEALTHY:
        op = Op.FAULT
        values |= {"quarantine_reason": Quarantine.FAULT, "quarantine_detail": detail}
    else:
        op = Op.HOST_REPORT
        values |= {"quarantine_reason": "", "quarantine_detail": ""}
    done = moves.move(conn, DEVICE, op, "id = ?", (device_id,), state=state, **values)
    if done == 0:
        raise errors.DeviceNotFound(f"no such device: {device_id}")


def retire(conn: queries.Conn, device_id: str) -> None:
    """Remove a device and everything keyed to it except job history."""
    if queries.device(conn, device_id, lock=True) is None:
        raise errors.DeviceNotFound(f"no such device: {device_id}", code="device_not_found")
    if conn.one(_LIVE_LEASE_ON, (device_id,)):
        raise errors.DeviceBusy(f"a live lease holds {device_id}: kill or release it first")
    for table in ("device_labels", "host_docs", "reservations", "leases"):
        conn.execute(f"DELETE FROM {table} WHERE device_id = ?", (device_id,))
    moves.remove(conn, DEVICE, Op.RETIRE, "id = ?", (device_id,))


_LIVE_LEASE_ON = "SELECT 1 FROM leases WHERE device_id = ? AND released_at IS NULL LIMIT 1"


def drain(conn: queries.Conn, now: int, device_id: str, by: str, reason: str) -> None:
    """Flag a device draining: what it runs finishes, nothing new is placed.

    Not a state: the device keeps its state, its lease and its place for selectors and
    pinned submits. Draining again replaces who, when and why. ``DeviceNotFound`` for
    an unknown device.
    """
    done = conn.execute(
        "UPDATE devices SET draining = 1, drained_by = ?, drained_at = ?, drain_reason = ?"
        " WHERE id = ?",
        (by, now, reason, device_id),
    ).rowcount
    if done == 0:
        raise errors.DeviceNotFound(f"no such device: {device_id}")
    # A reservation is a claim to be placed next; a draining device is never reserved.
    conn.execute("DELETE FROM reservations WHERE device_id = ?", (device_id,))


def undrain(conn: queries.Conn, device_id: str) -> None:
    """Clear the drain flag and its who/when/why; a device not draining is left as it is."""
    if queries.device(conn, device_id) is None:
        raise errors.DeviceNotFound(f"no such device: {device_id}")
    conn.execute(
        "UPDATE devices SET draining = 0, drained_by = '', drained_at = 0, drain_reason = ''"
        " WHERE id = ? AND draining != 0",
        (device_id,),
    )


def auto_recover(
    conn: queries.Conn, now: int, worker_id: str, proof: expiry.Proof | None
) -> AutoRecovery:
    """Return this worker's recoverable quarantines to the pool on a valid proof.

    Candidates: the worker's own ``unhealthy`` devices whose reason is recoverable
    (``worker_lost``, ``lease_expired``, ``registration``) and that hold no live lease,
    in device-ID order. Never ``fault`` (the host said the hardware is unfit), never
    ``''`` (cause unknown), never another worker's device. Each candidate is judged by
    the flap guard: at most 3 automatic recoveries per sliding hour, then
    it waits for a person. *Why: repeated quarantine-and-return cycles signal a real
    fault that automatic looping would hide.*
    """
    if proof is None or not proof.proves_clean:
        return AutoRecovery()
    candidates = conn.all(
        f"SELECT id, quarantine_reason FROM devices WHERE worker_id = ? AND state = ?"
        f" AND {_RECOVERABLE_IN} AND NOT {_LEASED} ORDER BY id",
        (worker_id, str(DeviceState.UNHEALTHY), *_RECOVERABLE),
    )
    recovered: list[Recovered] = []
    held_back: list[str] = []
    for device_id, reason in candidates:
        # Pruning is lazy: only devices being considered lose their old rows.
        conn.execute(
            "DELETE FROM device_recoveries WHERE device_id = ? AND at < ?",
            (device_id, expiry.flap_cutoff(now)),
        )
        recent = conn.value(
            "SELECT count(*) FROM device_recoveries WHERE device_id = ?", (device_id,)
        )
        if not expiry.flap_allows(int(recent)):
            held_back.append(device_id)
            continue
        done = moves.move(
            conn,
            DEVICE,
            Op.AUTO_RECOVER,
            "id = ?",
            (device_id,),
            state=DeviceState.READY,
            quarantine_reason="",
            quarantine_detail="",
        )
        if done != 1:
            continue
        conn.execute(
            "INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, ?, ?)",
            (device_id, now, reason),
        )
        recovered.append(Recovered(device_id=device_id, reason=reason))
    return AutoRecovery(recovered=recovered, held_back=held_back)


def recovery_history(conn: queries.Conn, now: int, device_id: str) -> RecoveryHistory:
    """The device's automatic recoveries inside the window, newest first.

    Filters by the window itself rather than trusting pruning, which only happens for
    devices being considered for recovery. An unknown device has an empty history.
    """
    rows = conn.all(
        "SELECT at, reason FROM device_recoveries WHERE device_id = ? AND at >= ?"
        " ORDER BY at DESC, reason",
        (device_id, expiry.flap_cutoff(now)),
    )
    return RecoveryHistory(
        recoveries=[RecoveryEntry(at=int(at), reason=reason) for at, reason in rows],
        remaining=expiry.flap_remaining(len(rows)),
        limit=expiry.FLAP_LIMIT,
        window=expiry.FLAP_WINDOW,
    )
