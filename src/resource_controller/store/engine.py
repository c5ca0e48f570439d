"""Open the database (SQLite with ``synchronous=FULL``: a granted lease must survive power loss; or
PostgreSQL) and migrate it; SQLAlchemy and Alembic load only when not at ``HEAD``."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resource_controller import errors
from resource_controller.store import locks, private

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlalchemy as sa
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
#: The newest revision: a database at it opens without SQLAlchemy or Alembic (a test holds it).
HEAD = "0015"

#: URL schemes taken for PostgreSQL (SQLAlchemy's driver name is added).
POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")


def check_database(database: str) -> str:
    """``database`` if it is a path or a PostgreSQL URL; an error naming it otherwise."""
    if "://" in database and not database.startswith(POSTGRES_SCHEMES):
        scheme = database.split("://", 1)[0]
        raise errors.StoreError(
            f"--database: {scheme}:// is not a database rc can use (a postgresql:// URL,"
            " or leave it unset for SQLite in the data directory)"
        )
    return database


@dataclass(frozen=True)
class Database:
    """Where the state lives: a SQLite file or a PostgreSQL server, and how to connect."""

    #: The SQLite file, or the PostgreSQL URL as libpq takes it (``postgresql://``).
    target: Path | str
    #: ``sqlite`` or ``postgresql``, as ``sql.Db`` is told.
    dialect: str

    @classmethod
    def at(cls, database: Path | str) -> Database:
        for scheme in POSTGRES_SCHEMES:
            if isinstance(database, str) and database.startswith(scheme):
                return cls("postgresql://" + database[len(scheme) :], "postgresql")
        return cls(Path(database), "sqlite")

    @property
    def libpq_url(self) -> str | None:
        """The PostgreSQL URL for the controllers' own connections; None for SQLite."""
        return str(self.target) if self.dialect == "postgresql" else None

    def where(self) -> str:
        """The database for a message: the file, or the URL with its password hidden."""
        if self.dialect == "sqlite":
            return str(self.target)
        parts = urllib.parse.urlsplit(str(self.target))
        if parts.password is None:
            return str(self.target)
        user = urllib.parse.unquote(parts.username or "")
        host = parts.netloc.rsplit("@", 1)[1]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))

    def connect(self) -> Any:
        """The store's connection: the driver's own, in autocommit."""
        if self.dialect == "postgresql":
            return connect_postgres(str(self.target))
        return _sqlite_connection(Path(self.target))


#: So a frozen or cut-off controller stalls no other past a takeover's 5 s (EXT-PG-8): a transaction
#: ends 3 s after its last statement, a lock wait gives up at 5 s, a quiet link drops within 5 s.
SESSION = {
    "idle_in_transaction_session_timeout": "3s",
    "lock_timeout": "5s",
    "tcp_keepalives_idle": "2",
    "tcp_keepalives_interval": "1",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "5000",
}

#: libpq's side of the same: give up within 5 s on a server it cannot reach.
CLIENT = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "2",
    "keepalives_interval": "1",
    "keepalives_count": "3",
    "tcp_user_timeout": "5000",
}


def session_settings(settings: dict[str, str]) -> str:
    """The one statement that applies ``settings`` to a session (known names only)."""
    rows = ", ".join(f"('{name}', '{value}')" for name, value in settings.items())
    return (
        "SELECT set_config(s.name, s.value, false)"
        f" FROM (VALUES {rows}) AS s (name, value) JOIN pg_settings p ON p.name = s.name"
    )


_SESSION = session_settings(SESSION)


def conninfo(url: str) -> str:
    """``url`` with ``CLIENT`` added, and this process named in ``pg_stat_activity``."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    for name, value in CLIENT.items():
        params.setdefault(name, value)
    params.setdefault("fallback_application_name", f"rc {os.getpid()}")
    return make_conninfo("", **params)


def connect_postgres(url: str) -> Any:
    """A controller's connection to PostgreSQL: autocommit, ``SESSION`` applied."""
    try:
        import psycopg
    except ImportError as exc:
        raise errors.StoreError(
            "a postgresql:// database needs psycopg: install rc with its postgresql extra"
        ) from exc
    conn = psycopg.connect(conninfo(url), autocommit=True)
    try:
        conn.execute(_SESSION)
    except BaseException:
        conn.close()
        raise
    return conn


def _sqlite_connection(path: Path) -> sqlite3.Connection:
    """A connection to the SQLite file with the project's pragmas, its files 0600."""
    private.private_file(path)
    for side in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if side.exists():
            private.private_file(side)
    conn = sqlite3.connect(path, check_same_thread=False, timeout=5.0, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA foreign_keys=ON")
    # PostgreSQL's ``strpos``, so the store's SQL reads the same on both.
    conn.create_function("strpos", 2, _strpos, deterministic=True)
    return conn


def _strpos(text: str | None, part: str | None) -> int | None:
    """1-based position of ``part`` in ``text``, 0 when absent (PostgreSQL's ``strpos``)."""
    if text is None or part is None:
        return None
    return text.find(part) + 1


def dropped(driver: Any) -> bool:
    """Whether the server closed ``driver``'s idle connection (never on SQLite)."""
    if isinstance(driver, sqlite3.Connection):
        return False
    import psycopg

    with contextlib.suppress(psycopg.OperationalError):  # the end: broken from here
        for _ in range(2):
            driver.pgconn.consume_input()
    return bool(driver.closed)


def first_line(exc: Exception) -> str:
    """What a driver error says, in its first line (its type when it says nothing)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def open_driver(database: Database) -> Any:
    """The store's connection; ``StoreError`` naming the database when it cannot be made."""
    try:
        return database.connect()
    except errors.StoreError:
        raise
    except Exception as exc:
        where = database.where()
        raise errors.StoreError(f"cannot reach the database {where}: {first_line(exc)}") from exc


def create_engine(database: Path | str) -> sa.Engine:
    """A SQLAlchemy engine on the database, for Alembic: the migrations' connection."""
    import sqlalchemy as sa

    db = Database.at(database)
    if db.dialect == "postgresql":
        url = "postgresql+psycopg://" + str(db.target)[len("postgresql://") :]
        return sa.create_engine(url, poolclass=sa.pool.NullPool)
    engine = sa.create_engine(
        "sqlite://",
        creator=lambda: _sqlite_connection(Path(db.target)),
        poolclass=sa.pool.StaticPool,
    )

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Alembic's transactions: the same BEGIN IMMEDIATE as the store's own.
        driver = conn.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        driver.execute("BEGIN IMMEDIATE")

    return engine


def _alembic_config(connection: sa.Connection) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def current_revision(driver: Any, dialect: str) -> str | None:
    """The schema revision Alembic stamped, read without it; None when there is none."""
    if dialect == "postgresql":
        (found,) = driver.execute("SELECT to_regclass('alembic_version')").fetchone()
    else:
        found = driver.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
        ).fetchone()
    if not found:
        return None
    for (version,) in driver.execute("SELECT version_num FROM alembic_version"):
        return str(version)
    return None


def migrate(database: Database, driver: Any) -> None:
    """Bring the schema to the newest revision (on a connection of Alembic's own), refusing
    a database from a newer version; ``driver`` answers whether there is anything to do."""
    if current_revision(driver, database.dialect) == HEAD:
        return
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    engine = create_engine(database.target)
    try:
        with engine.connect() as conn:
            if database.dialect == "postgresql":
                import sqlalchemy as sa

                # Controllers starting together: one migrates, the others wait here.
                conn.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": locks.MIGRATION}
                )
            script = ScriptDirectory.from_config(_alembic_config(conn))
            current = MigrationContext.configure(conn).get_current_revision()
            try:  # Alembic raises for a revision it cannot locate: a newer one
                known = current is None or script.get_revision(current) is not None
            except CommandError:
                known = False
            if not known:
                raise errors.StoreError(
                    f"database schema revision {current} was written by a newer version of rc"
                )
            command.upgrade(_alembic_config(conn), "head")
            conn.commit()
    finally:
        engine.dispose()
