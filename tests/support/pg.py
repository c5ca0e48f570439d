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
    created: list[str] = field(default_factory=list)
    #: The server's options, to start it again after ``halt`` (``resume``).
    options: str = ""

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

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

    def halt(self) -> None:
        """Stop the server, keeping its data: a database outage until ``resume``."""
        self._ctl("-m", "immediate", "stop")

    def resume(self) -> None:
        """Start the server ``halt`` stopped, on its data, and wait until it answers."""
        self._ctl("-o", self.options, "-l", str(self.root / "server.log"), "-w", "start")

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*_as_postgres(), str(self.bins / "pg_ctl"), "-D", str(self.root / "data"), *args],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def stop(self) -> None:
        self.halt()
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
