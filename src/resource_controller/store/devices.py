"""Workers and devices (store.md §13-17). Silence is never proof: nothing here makes an
occupied-looking device ``ready`` without a proof the spec lists."""

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
from resource_controller.core.transitions import DEVICE, Op
from resource_controller.store import (
    attempts,
    leadership,
    leases,
    moves,
    queries,
    races,
    sql,
    sweep,
)
from resource_controller.store.base import Core
from resource_controller.store.records import AutoRecovery, Recovered, Registration, SweepResult

_ACTIVE = tuple(s.value for s in ACTIVE)
_RECOVERABLE = tuple(r.value for r in RECOVERABLE)
_RECOVERABLE_IN = f"quarantine_reason IN ({sql.marks(len(_RECOVERABLE))})"


def worker_id_for(host: str) -> str:
    """UUIDv5 of the host in the DNS namespace: a restarted worker resumes its own devices."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, host))


class Devices:
    """The operations on workers and devices, each in the core's one transaction context."""

    def __init__(self, core: Core) -> None:
        self._core = core

    @races.again
    def register(self, host: str, boot_id: str, declared: list[tuple[str, int]]) -> Registration:
        """STORE-110..112: upsert the worker, reap its in-flight jobs, declare its devices."""
        with self._core.tx("register") as c:
            now = self._core.now()
            worker_id = worker_id_for(host)
            queries.lock_worker_devices(c, worker_id)
            stored = c.value("SELECT boot_id FROM workers WHERE id = ?", (worker_id,))
            reboot = bool(stored) and bool(boot_id) and stored != boot_id
            c.execute(
                "INSERT INTO workers (id, host, boot_id, last_heartbeat_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET host = excluded.host,"
                " boot_id = excluded.boot_id, last_heartbeat_at = excluded.last_heartbeat_at",
                (worker_id, host, boot_id, now),
            )
            reaped, requeued = _reap(c, now, worker_id, reboot)
            if reboot:
                # A host down past the write-off has nothing in flight; the reboot proves it empty.
                where = f"worker_id = ? AND {_RECOVERABLE_IN} AND NOT {queries.LEASED}"
                params = (worker_id, *_RECOVERABLE)
                moves.set_devices(c, Op.REBOOT_RECOVER, where, params, DeviceState.READY)
            for name, ceiling in declared:
                _declare(c, now, host, worker_id, name, max(0, int(ceiling)))
            superseded = _mark_superseded(c, now, host, worker_id, [n for n, _ in declared])
        return Registration(worker_id, reboot, reaped, requeued, superseded)

    @races.again
    def auto_recover(self, worker_id: str, proof: expiry.Proof | None) -> AutoRecovery:
        """STORE-121: return the worker's recoverable, unleased quarantined devices, each as the
        flap guard allows: repeated returns signal a real fault."""
        if proof is None or not proof.proves_clean:
            return AutoRecovery()
        with self._core.tx() as c:
            now = self._core.now()
            candidates = c.all(
                "SELECT id, quarantine_reason FROM devices WHERE worker_id = ? AND state = ?"
                f" AND {_RECOVERABLE_IN} AND NOT {queries.LEASED} ORDER BY id",
                (worker_id, str(DeviceState.UNHEALTHY), *_RECOVERABLE),
            )
            recovered: list[Recovered] = []
            held_back: list[str] = []
            for device_id, reason in candidates:
                # Pruning is lazy: only devices being considered lose their old rows.
                c.execute(
                    "DELETE FROM device_recoveries WHERE device_id = ? AND at < ?",
                    (device_id, expiry.flap_cutoff(now)),
                )
                recent = c.value(
                    "SELECT count(*) FROM device_recoveries WHERE device_id = ?", (device_id,)
                )
                if not expiry.flap_allows(int(recent)):
                    held_back.append(device_id)
                    continue
                ready = DeviceState.READY
                if moves.set_devices(c, Op.AUTO_RECOVER, "id = ?", (device_id,), ready) == 1:
                    c.execute(
                        "INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, ?, ?)",
                        (device_id, now, reason),
                    )
                    recovered.append(Recovered(device_id, reason))
        return AutoRecovery(recovered, held_back)

    @races.reconnecting
    def worker_host(self, worker_id: str) -> str:
        """STORE-132: the registered host of a worker; ``WorkerNotFound`` when unknown."""
        with self._core.read() as c:
            host = c.value("SELECT host FROM workers WHERE id = ?", (worker_id,))
        if host is None:
            raise errors.WorkerNotFound(f"no such worker: {worker_id}")
        return str(host)

    @races.again
    def apply_facts(
        self,
        host: str,
        names: list[str],
        labels: Mapping[str, Mapping[str, str]] | None,
        declared: Mapping[str, Mapping[str, str]] | None,
        sheet: str | None,
        device_sheets: Mapping[str, str] | None,
    ) -> None:
        """STORE-144, STORE-153: labels and sheets; an absent map or sheet keeps what is stored."""
        with self._core.tx() as c:
            now = self._core.now()
            for source, facts in (("detected", labels), ("declared", declared)):
                if facts is None:
                    continue
                host_wide = dict(facts.get("", {}))
                for name in names:
                    if name in facts:
                        pairs = host_wide | dict(facts[name])
                        _replace_labels(c, now, f"{host}:{name}", source, pairs)
            sheets = {"": sheet} if sheet is not None else {}
            for name in names:
                if device_sheets is not None and name in device_sheets:
                    sheets[f"{host}:{name}"] = device_sheets[name]
            if sheets:
                c.many(
                    "INSERT INTO host_docs (host, device_id, body, updated_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (host, device_id) DO UPDATE SET body = excluded.body,"
                    " updated_at = excluded.updated_at",
                    [(host, device_id, body, now) for device_id, body in sheets.items()],
                )

    @races.again
    def clear(self, device_id: str) -> bool:
        """STORE-130: an operator returns an unhealthy, unleased device to the pool."""
        with self._core.tx() as c:
            where = f"id = ? AND NOT {queries.LEASED}"
            return moves.set_devices(c, Op.CLEAR, where, (device_id,), DeviceState.READY) == 1

    @races.again
    def set_state(self, device_id: str, state: str, detail: str = "") -> None:
        """STORE-131, the host's own report: ``unhealthy`` is a ``fault`` that overwrites
        any reason, with ``detail``; ``DeviceNotFound`` for an unknown device."""
        fault = state == DeviceState.UNHEALTHY
        op, reason = (Op.FAULT, Quarantine.FAULT) if fault else (Op.HOST_REPORT, "")
        with self._core.tx() as c:
            now = self._core.now()
            detail = detail if fault else ""
            one = (device_id,)
            done = moves.set_devices(
                c, op, "id = ?", one, state, reason, quarantine_detail=detail, last_heartbeat_at=now
            )
        if done == 0:
            raise errors.DeviceNotFound(f"no such device: {device_id}")

    @races.again
    def drain(self, device_id: str, by: str, reason: str) -> None:
        """EXT-DRAIN-2: flag a device draining (not a state); again replaces who, when and why."""
        with self._core.tx() as c:
            done = c.execute(
                "UPDATE devices SET draining = 1, drained_by = ?, drained_at = ?,"
                " drain_reason = ? WHERE id = ?",
                (by, self._core.now(), reason, device_id),
            ).rowcount
            if done == 0:
                raise errors.DeviceNotFound(f"no such device: {device_id}")
            # A draining device is never reserved.
            c.execute("DELETE FROM reservations WHERE device_id = ?", (device_id,))

    @races.again
    def undrain(self, device_id: str) -> None:
        """Clear the drain flag; a device not draining is left as it is."""
        with self._core.tx() as c:
            if queries.device(c, device_id) is None:
                raise errors.DeviceNotFound(f"no such device: {device_id}")
            c.execute(
                "UPDATE devices SET draining = 0, drained_by = '', drained_at = 0,"
                " drain_reason = '' WHERE id = ? AND draining != 0",
                (device_id,),
            )

    @races.again
    def retire(self, device_id: str) -> None:
        """STORE-133: remove a device and everything keyed to it except job history."""
        with self._core.tx() as c:
            # Locked first (the lock-first rule): a grant committing meanwhile is seen.
            if queries.device(c, device_id, lock=True) is None:
                raise errors.DeviceNotFound(f"no such device: {device_id}", code="device_not_found")
            if c.one(_LIVE_LEASE_ON, (device_id,)):
                raise errors.DeviceBusy(f"a live lease holds {device_id}: kill or release it first")
            for table in ("device_labels", "host_docs", "reservations", "leases"):
                c.execute(f"DELETE FROM {table} WHERE device_id = ?", (device_id,))
            moves.remove(c, DEVICE, Op.RETIRE, "id = ?", (device_id,))

    @races.again
    def sweep(self, rules: expiry.SweepRules, fence: leadership.Fence | None = None) -> SweepResult:
        """One sweep, never freeing a device; for the leader of ``fence`` only."""
        with self._core.tx("sweep") as c:
            leadership.hold(c, fence)
            return sweep.sweep(c, self._core.now(), rules)


_LIVE_LEASE_ON = "SELECT 1 FROM leases WHERE device_id = ? AND released_at IS NULL LIMIT 1"


def _declare(c: sql.Db, now: int, host: str, worker_id: str, name: str, ceiling: int) -> None:
    """STORE-110 step 5 for one declared device: created ``ready``, or taken over by
    this worker with its ceiling, back to ``ready`` unless it is ``unhealthy``."""
    device_id = f"{host}:{name}"
    values: dict[str, object] = {
        "worker_id": worker_id,
        "last_heartbeat_at": now,
        "max_runtime_seconds": ceiling,
    }
    if queries.device(c, device_id) is None:
        row = {"id": device_id, "host": host, "name": name, "state": DeviceState.READY, **values}
        moves.create(c, DEVICE, Op.REGISTER_NEW, row)
        return
    # An unhealthy device keeps its state and reason; any other returns to ready.
    if not moves.move(
        c,
        DEVICE,
        Op.REDECLARE,
        "id = ?",
        (device_id,),
        state=DeviceState.READY,
        quarantine_reason="",
        **values,
    ):
        c.execute(
            "UPDATE devices SET worker_id = ?, last_heartbeat_at = ?, max_runtime_seconds = ?"
            " WHERE id = ?",
            (worker_id, now, ceiling, device_id),
        )


def _mark_superseded(
    conn: sql.Db, now: int, host: str, worker_id: str, declared: list[str]
) -> dict[str, list[str]]:
    """Mark devices a declared one now stands for ``mig_conflict``: stale labels match."""
    existing = [
        name for (name,) in conn.all("SELECT name FROM devices WHERE worker_id = ?", (worker_id,))
    ]
    marked: dict[str, list[str]] = {}
    for name, by in mig.superseded(declared, existing).items():
        device_id = f"{host}:{name}"
        _replace_labels(conn, now, device_id, "detected", {mig.CONFLICT: mig.superseded_text(by)})
        marked[device_id] = by
    return marked


def _reap(conn: sql.Db, now: int, worker_id: str, reboot: bool) -> tuple[list[str], list[str]]:
    """STORE-111: end the worker's in-flight jobs ``lost`` (or queue them again) and settle their
    devices; (every job reaped, those queued again)."""
    reaped = queries.jobs_where(
        conn, f"worker_id = ? AND state IN ({sql.marks(len(_ACTIVE))})", (worker_id, *_ACTIVE)
    )
    reason = REASON_HOST_REBOOTED if reboot else REASON_REREGISTERED
    requeued: list[str] = []
    for job in reaped:
        if attempts.end(conn, Op.REAP, job, JobState.LOST, reason, now) == JobState.QUEUED:
            requeued.append(job.id)
        devices = sorted(set(leases.release_for_job(conn, now, job.id)) | set(job.devices))
        if not devices:
            continue
        where = queries.id_in(len(devices))
        if reboot:
            moves.set_devices(conn, Op.REAP_REBOOT, where, devices, DeviceState.READY)
        else:
            out, why = DeviceState.UNHEALTHY, Quarantine.REGISTRATION
            moves.set_devices(conn, Op.REAP, where, devices, out, why)
    return [job.id for job in reaped], requeued


def _replace_labels(
    conn: sql.Db, now: int, device_id: str, source: str, pairs: dict[str, str]
) -> None:
    """STORE-141: the device's labels of ``source`` become ``pairs``."""
    conn.execute(
        "DELETE FROM device_labels WHERE device_id = ? AND source = ?", (device_id, source)
    )
    if pairs:
        conn.many(
            "INSERT INTO device_labels (device_id, key, value, source, updated_at)"
            " VALUES (?, ?, ?, ?, ?)",
            [(device_id, k, v, source, now) for k, v in pairs.items()],
        )
