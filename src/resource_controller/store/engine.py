"""Open the database: a SQLite file (the default) or a PostgreSQL URL, and migrate it.

SQLite in WAL mode with ``synchronous=FULL`` (a granted lease must survive power
loss) and a 5000 ms busy timeout. PostgreSQL through psycopg 3. On both,
the driver's own transaction handling is off (autocommit), and the store begins each
transaction itself (``sql.Db.begin``: ``BEGIN IMMEDIATE`` on SQLite, so the
allocation transaction holds the write lock from its first statement).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from resource_controller import errors
from resource_controller.store import locks, private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).parent / "migrations"
#: The newest migration's revision: a database already there is opened without loading
#: Alembic (about 12 MiB of a controller's resident memory). A test holds it to the
#: migrations directory's head.
HEAD = "0012"


def _alembic_config(connection: sa.Connection) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


#: URL schemes taken for PostgreSQL (SQLAlchemy's driver name is added).
POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")


def is_postgres(database: Path | str) -> bool:
    return isinstance(database, str) and database.startswith(POSTGRES_SCHEMES)


def check_database(database: str) -> str:
    """``database`` if it is a path or a PostgreSQL URL; an error naming it otherwise."""
    if "://" in database and not is_postgres(database):
        scheme = database.split("://", 1)[0]
        raise errors.StoreError(
            f"--database: {scheme}:// is not a database rc can use (a postgresql:// URL,"
            " or leave it unset for SQLite in the data directory)"
        )
    return database


def create_engine(database: Path | str) -> sa.Engine:
    """An engine on the SQLite file at ``database``, or on the PostgreSQL URL it is."""
    if is_postgres(database):
        return _postgres_engine(str(database))
    return _sqlite_engine(Path(database))


def _postgres_engine(url: str) -> sa.Engine:
    for scheme in POSTGRES_SCHEMES:
        if url.startswith(scheme):
            url = "postgresql+psycopg://" + url[len(scheme) :]
            break
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise errors.StoreError(
            "a postgresql:// database needs psycopg: install rc with its postgresql extra"
        ) from exc
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


def libpq_url(engine: sa.Engine) -> str | None:
    """The PostgreSQL database as a libpq URL (for connections outside the store, such as
    the controllers' leadership and wake-ups); None for SQLite."""
    if engine.dialect.name != "postgresql":
        return None
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def open_driver(engine: sa.Engine) -> tuple[sa.Connection, Any]:
    """A connection for the store and the driver's connection under it, in autocommit:
    ``sql.Db`` begins and ends each transaction itself."""
    conn = engine.connect()
    if engine.dialect.name == "postgresql":
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
    driver = conn.connection.driver_connection
    assert driver is not None, "a connection just opened has its driver's"
    if engine.dialect.name == "postgresql":
        driver.autocommit = True
    return conn, driver


def _sqlite_engine(path: Path) -> sa.Engine:
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
        # Alembic's transactions: the same BEGIN IMMEDIATE as the store's own.
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
    from alembic.util import CommandError

    # Alembic raises (CommandError) for a revision it cannot locate rather than
    # returning None, so an unknown, newer revision must be caught here.
    try:
        return script.get_revision(revision) is not None
    except CommandError:
        return False


def _current(conn: sa.Connection) -> str | None:
    """The schema revision Alembic stamped, without Alembic; None when there is none yet."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    row = conn.execute(sa.text("SELECT version_num FROM alembic_version")).first()
    conn.rollback()  # leave no transaction open for Alembic to find
    return None if row is None else str(row[0])


def migrate(engine: sa.Engine) -> None:
    """Bring the schema to the newest revision; refuse a database from a newer version."""
    try:
        conn = engine.connect()
    except sa.exc.OperationalError as exc:
        where = engine.url.render_as_string(hide_password=True)
        cause = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        raise errors.StoreError(f"cannot reach the database {where}: {cause}") from exc
    with conn:
        if _current(conn) == HEAD:
            return
        from alembic import command
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        if engine.dialect.name == "postgresql":
            # Controllers starting together: one migrates, the others wait here, then
            # find the schema current.
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": locks.MIGRATION})
        script = ScriptDirectory.from_config(_alembic_config(conn))
        current = MigrationContext.configure(conn).get_current_revision()
        if current is not None and not _known_revision(script, current):
            raise errors.StoreError(
                f"database schema revision {current} was written by a newer version of rc"
            )
        command.upgrade(_alembic_config(conn), "head")
        conn.commit()
