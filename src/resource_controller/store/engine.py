"""Open the database: SQLite pragmas, our own BEGIN, and migrations on open.

SQLite in WAL mode with ``synchronous=FULL`` (a granted lease must survive power
loss) and a 5000 ms busy timeout (STORE-001). pysqlite's own transaction handling
is switched off and every transaction starts with ``BEGIN IMMEDIATE``, so the
allocation transaction holds the write lock from its first statement, as the
SQLAlchemy SQLite dialect documentation describes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from resource_controller import errors
from resource_controller.store import private

MIGRATIONS = Path(__file__).parent / "migrations"


def _alembic_config(connection: sa.Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def create_engine(path: Path) -> sa.Engine:
    """An engine on the SQLite file at ``path`` with the project's pragmas.

    The file is created 0600 before SQLite opens it; its WAL and shared-memory files
    take the same mode from it.
    """
    private.private_file(path)
    for side in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if side.exists():
            private.private_file(side)
    engine = sa.create_engine(
        f"sqlite:///{path}",
        connect_args={"check_same_thread": False, "timeout": 5.0},
        poolclass=sa.pool.StaticPool,
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=5000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
        # PostgreSQL's ``strpos``, so the store's SQL reads the same on both.
        dbapi_connection.create_function("strpos", 2, _strpos, deterministic=True)

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Straight to the driver: the statement needs none of SQLAlchemy's execution
        # machinery, which costs more than the BEGIN itself.
        driver = conn.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        driver.execute("BEGIN IMMEDIATE")

    return engine


def _strpos(text: str | None, part: str | None) -> int | None:
    """1-based position of ``part`` in ``text``, 0 when absent (PostgreSQL's ``strpos``)."""
    if text is None or part is None:
        return None
    return text.find(part) + 1


def _known_revision(script: ScriptDirectory, revision: str) -> bool:
    # Alembic raises (CommandError) for a revision it cannot locate rather than
    # returning None, so an unknown, newer revision must be caught here (STORE-006).
    try:
        return script.get_revision(revision) is not None
    except CommandError:
        return False


def migrate(engine: sa.Engine) -> None:
    """Bring the schema to the newest revision; refuse a database from a newer version."""
    from alembic import command

    with engine.connect() as conn:
        script = ScriptDirectory.from_config(_alembic_config(conn))
        current = MigrationContext.configure(conn).get_current_revision()
        conn.rollback()
        if current is not None and not _known_revision(script, current):
            raise errors.StoreError(
                f"database schema revision {current} was written by a newer version of rc"
            )
        command.upgrade(_alembic_config(conn), "head")
        conn.commit()
