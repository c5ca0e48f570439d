"""Which controller leads on PostgreSQL: a lease row (migration 0013), not a lock a frozen process
would keep; every leader-only write checks its epoch (``hold``)."""

from __future__ import annotations

from dataclasses import dataclass

from resource_controller import errors
from resource_controller.store import sql

#: Now on the database's clock: every instant of the row is on it, never a controller's.
_NOW = "extract(epoch FROM clock_timestamp())"

#: Take the lease: (holder, lease seconds); the new epoch, or no row (psycopg placeholders).
TAKE = (
    "UPDATE leadership SET holder = %s, epoch = epoch + 1, backend = pg_backend_pid(),"
    f" expires_at = {_NOW} + %s"
    " WHERE id = (SELECT l.id FROM leadership l WHERE l.id = 1"
    f" AND (l.expires_at <= {_NOW}"
    " OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend))"
    " FOR UPDATE OF l SKIP LOCKED) RETURNING epoch"
)

#: Renew it: (lease seconds, holder, epoch); the epoch, or no row once it is lost.
RENEW = (
    f"UPDATE leadership SET expires_at = {_NOW} + %s"
    f" WHERE id = 1 AND holder = %s AND epoch = %s AND expires_at > {_NOW} RETURNING epoch"
)

_HOLDS = (
    "SELECT 1 FROM leadership WHERE id = 1 AND holder = ? AND epoch = ?"
    f" AND expires_at > {_NOW} FOR KEY SHARE"
)


@dataclass(frozen=True)
class Fence:
    """The leadership a leader-only write is made under: who, and in which epoch."""

    holder: str
    epoch: int


def hold(db: sql.Db, fence: Fence | None) -> None:
    """``NotLeading`` unless ``fence`` still holds the lease, share-locked to the commit so no
    takeover passes half-way; None: SQLite's one controller."""
    if fence is None:
        return
    if db.one(_HOLDS, (fence.holder, fence.epoch)) is None:
        raise errors.NotLeading(
            f"this controller no longer leads (epoch {fence.epoch} is over): nothing written"
        )
