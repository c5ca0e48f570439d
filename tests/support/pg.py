"""A throwaway PostgreSQL cluster for the suite, started by the tests themselves.

Debian's ``postgresql`` package provides ``initdb`` and ``pg_ctl`` (``.ci/run`` installs
it); nothing assumes a server is already running. The cluster lives in a temporary
directory, listens only on a Unix socket there, and trades durability for speed
(``fsync=off``): it holds test data only. A template database is migrated once, and each
test gets its own copy of it (``CREATE DATABASE ... TEMPLATE``), so tests never see each
other's rows. Run as root (as CI does), the server runs as the ``postgres`` user, since
PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: The database every test's copy is made from, migrated once per cluster.
TEMPLATE = "rc_template"


def bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: Debian's versioned directory, else ``PATH``."""
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted(
            (p for p in root.iterdir() if (p / "bin" / "initdb").exists()),
            key=lambda p: int(p.name) if p.name.isdigit() else 0,
        )
        if versions:
            return versions[-1] / "bin"
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _as_postgres() -> list[str]:
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


@dataclass
class Cluster:
    """One running server; ``url(db)`` names a database on it."""

    root: Path
    bins: Path
    #: The server's options, as ``start`` gave them (``up`` starts it with them again).
    options: str = ""
    created: list[str] = field(default_factory=list)

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def log(self) -> Path:
        """The server's log: each line names its session's PID and application."""
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://rc@/{database}?host={self.socket_dir}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        out = subprocess.run(
            [
                str(self.bins / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.socket_dir),
                "-U",
                "rc",
                "-d",
                database,
                "-c",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout.strip()

    def fresh_database(self) -> str:
        """A new database, a copy of the migrated template; its URL."""
        name = "rc_" + uuid.uuid4().hex[:16]
        self.psql(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        self.created.append(name)
        return self.url(name)

    def restart(self) -> None:
        """Restart the server as an operator would (``pg_ctl restart -m fast``): every
        session is told ``terminating connection due to administrator command`` and
        closed; the server is back, on the same socket, when this returns."""
        subprocess.run(
            [
                *_as_postgres(),
                str(self.bins / "pg_ctl"),
                "-D",
                str(self.root / "data"),
                "-l",
                str(self.log),
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "restart",
            ],
            check=True,
            capture_output=True,
            timeout=90,
        )

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run(
            [*_as_postgres(), str(self.bins / "pg_ctl"), "-D", str(self.root / "data"), *args],
            check=True,
            capture_output=True,
            timeout=90,
        )

    def down(self) -> None:
        """Stop the server as an operator would (``-m fast``), keeping its data: an
        outage until ``up``."""
        self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop")

    def up(self) -> None:
        """Start the server ``down`` stopped, with its options, on the same socket."""
        self._pg_ctl("-o", self.options, "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self) -> None:
        subprocess.run(
            [
                *_as_postgres(),
                str(self.bins / "pg_ctl"),
                "-D",
                str(self.root / "data"),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def start() -> Cluster:
    """initdb and start a cluster in a new temporary directory; raises when it cannot."""
    bins = bin_dir()
    if bins is None:
        raise FileNotFoundError("no PostgreSQL server binaries (Debian package postgresql)")
    root = Path(tempfile.mkdtemp(prefix="rc-pg-"))
    (root / "sock").mkdir()
    runner = _as_postgres()
    if runner:
        pg = pwd.getpwnam("postgres")
        os.chmod(root, 0o755)
        os.chown(root, pg.pw_uid, pg.pw_gid)
        os.chown(root / "sock", pg.pw_uid, pg.pw_gid)
    data = root / "data"
    subprocess.run(
        [
            *runner,
            str(bins / "initdb"),
            "-D",
            str(data),
            "-U",
            "rc",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    options = (
        f"-k {root / 'sock'} -c listen_addresses='' -c fsync=off -c synchronous_commit=off"
        " -c full_page_writes=off -c max_connections=200"
        # Each line names its session's application: a controller's is "rc <its PID>".
        " -c log_line_prefix='%m [%p] %a: '"
    )
    subprocess.run(
        [
            *runner,
            str(bins / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(root / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        ],
        check=True,
        capture_output=True,
        timeout=90,
    )
    cluster = Cluster(root=root, bins=bins, options=options)
    cluster.psql(f"CREATE DATABASE {TEMPLATE}")
    return cluster
