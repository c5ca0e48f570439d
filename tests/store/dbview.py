"""Direct access to a store's database, beside the Store, for arranging and checking.

Reads run in a transaction on a separate connection (``sqlite3``, or psycopg on
PostgreSQL), so they see one committed snapshot and never take SQLite's write lock. Writes are used only to arrange states
quickly that the store otherwise reaches only through a sequence of clock jumps and sweeps
(``unknown``, each quarantine reason) or that nothing creates today (a job-less lease).
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

from resource_controller.core import mig
from resource_controller.store.facade import Store
from support import store_helpers


def wid(host: str = "box") -> str:
    """The worker ID the spec derives from a host name (§2.1), computed independently."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, host))


def state_of(store: Store, device_id: str) -> tuple[str, str, str]:
    """A device's state, quarantine reason and detail, as the store reads them."""
    d = store_helpers.device(store, device_id)
    assert d is not None, device_id
    return d.state, d.quarantine_reason, d.quarantine_detail


class _Row(tuple[Any, ...]):
    """A row read by position or by column name, as ``sqlite3.Row`` is."""

    names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self.names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self.names)


class _Postgres:
    """A psycopg connection in autocommit that takes the store's ``?`` placeholders."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._conn = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, args: Any = ()) -> Any:
        cursor = self._conn.cursor(row_factory=_row_factory)
        return cursor.execute(sql.replace("%", "%%").replace("?", "%s"), tuple(args))

    def close(self) -> None:
        self._conn.close()


def _row_factory(cursor: Any) -> Any:
    names = {c.name: i for i, c in enumerate(cursor.description or ())}
    kind = type("Row", (_Row,), {"names": names})
    return lambda values: kind(values)


class Raw:
    def __init__(self, database: Path | str) -> None:
        self.postgres = isinstance(database, str)
        self.conn: Any
        if isinstance(database, str):
            self.conn = _Postgres(database)
        else:
            self.conn = sqlite3.connect(
                database, timeout=10, isolation_level=None, check_same_thread=False
            )
            self.conn.row_factory = sqlite3.Row

    def close(self) -> None:
        self.conn.close()

    def rows(self, sql: str, *args: Any) -> list[Any]:
        self.conn.execute("BEGIN")
        try:
            return list(self.conn.execute(sql, args).fetchall())
        finally:
            self.conn.execute("COMMIT")

    def write(self, sql: str, *args: Any) -> int:
        self.conn.execute("BEGIN" if self.postgres else "BEGIN IMMEDIATE")
        try:
            n = self.conn.execute(sql, args).rowcount
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return int(n)

    # ---- arranging ---------------------------------------------------------------------

    def force_device(self, device_id: str, state: str, reason: str = "", detail: str = "") -> None:
        """Put a device in a state directly, as a sweep, a reap or a fault report would."""
        n = self.write(
            "UPDATE devices SET state = ?, quarantine_reason = ?, quarantine_detail = ?"
            " WHERE id = ?",
            state,
            reason,
            detail,
            device_id,
        )
        assert n == 1, device_id

    def insert_jobless_lease(self, device_id: str, at: int, expires_at: int) -> str:
        lease_id = str(uuid.uuid4())
        self.write(
            "INSERT INTO leases (id, device_id, holder, job_id, acquired_at, expires_at)"
            " VALUES (?, ?, 'nobody', '', ?, ?)",
            lease_id,
            device_id,
            at,
            expires_at,
        )
        return lease_id

    # ---- reading -----------------------------------------------------------------------

    def device(self, device_id: str) -> Any:
        (row,) = self.rows("SELECT * FROM devices WHERE id = ?", device_id)
        return row

    def worker(self, worker_id: str) -> Any:
        (row,) = self.rows("SELECT * FROM workers WHERE id = ?", worker_id)
        return row

    def leases_of(self, job_id: str) -> list[Any]:
        return self.rows("SELECT * FROM leases WHERE job_id = ? ORDER BY acquired_at", job_id)

    def live_leases(self, device_id: str) -> list[Any]:
        return self.rows(
            "SELECT * FROM leases WHERE device_id = ? AND released_at IS NULL", device_id
        )

    def reservations(self) -> set[tuple[str, str]]:
        return {(r["job_id"], r["device_id"]) for r in self.rows("SELECT * FROM reservations")}

    def count(self, table: str) -> int:
        return int(self.rows(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"])


def invariant_violations(raw: Raw) -> list[str]:
    """Every breach of STORE-180..182 visible in one committed snapshot; [] when none."""
    bad: list[str] = []
    raw.conn.execute("BEGIN")
    try:
        q = raw.conn.execute
        for r in q(
            "SELECT device_id, COUNT(*) AS n FROM leases WHERE released_at IS NULL"
            " GROUP BY device_id HAVING COUNT(*) > 1"
        ):
            bad.append(f"STORE-180: device {r['device_id']} has {r['n']} live leases")
        live_by_job: dict[str, set[str]] = {}
        for r in q("SELECT job_id, device_id FROM leases WHERE released_at IS NULL"):
            live_by_job.setdefault(r["job_id"], set()).add(r["device_id"])
        hosts = {r["id"]: r["host"] for r in q("SELECT id, host FROM devices")}
        for r in q("SELECT id, state, device_id, device_count, device_ids FROM jobs"):
            active = r["state"] in ("assigned", "running")
            live = live_by_job.get(r["id"], set())
            # The job's own devices: its list (EXT-GANG-1) or its one device.
            own = {d for d in r["device_ids"].split(",") if d} or {r["device_id"]}
            if active and (live != own or len(live) != r["device_count"]):
                # EXT-GANG-2: all N leases or none, each on one of its own devices.
                bad.append(
                    f"STORE-181: {r['state']} job {r['id']} wants {r['device_count']} "
                    f"devices {sorted(own)} and has live leases on {sorted(live)}"
                )
            if active and len({hosts.get(d, "?") for d in live}) > 1:
                bad.append(f"EXT-GANG-1: job {r['id']} holds devices of several hosts")
            if active and r["device_id"] != min(own):
                bad.append(f"EXT-GANG-6: job {r['id']}'s device_id is not its first device")
            if not active and live:
                bad.append(f"STORE-181: {r['state']} job {r['id']} still has a live lease")
        for r in q(
            "SELECT d.id, d.state,"
            " (SELECT COUNT(*) FROM leases l WHERE l.device_id = d.id AND l.released_at IS NULL)"
            "   AS live"
            " FROM devices d"
        ):
            if r["state"] == "ready" and r["live"]:
                bad.append(f"STORE-182: ready device {r['id']} has a live lease")
            if r["state"] == "busy" and not r["live"]:
                bad.append(f"STORE-182: busy device {r['id']} has no live lease")
        for r in q("SELECT id, state FROM jobs"):
            if r["state"] not in (
                "queued",
                "assigned",
                "running",
                "succeeded",
                "failed",
                "killed",
                "lost",
            ):
                bad.append(f"STORE-040: job {r['id']} in unknown state {r['state']!r}")
        for r in q("SELECT id, state FROM devices"):
            if r["state"] not in ("ready", "busy", "unknown", "unhealthy"):
                bad.append(f"STORE-020: device {r['id']} in unknown state {r['state']!r}")
        held: dict[str, list[str]] = {}
        for r in q(
            "SELECT d.host, d.name FROM leases l JOIN devices d ON d.id = l.device_id"
            " WHERE l.released_at IS NULL"
        ):
            held.setdefault(r["host"], []).append(r["name"])
        for host, names in sorted(held.items()):
            for a, b in mig.overlapping(sorted(names)):
                bad.append(f"EXT-MIG-3: {host}:{a} and {host}:{b} are leased at once")
    finally:
        raw.conn.execute("COMMIT")
    return bad
