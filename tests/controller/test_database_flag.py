"""``rc serve --database`` (and ``RC_DATABASE``): what it takes, and what stops it.

A URL of a scheme rc cannot use, or a PostgreSQL server that does not answer, stops the
process before it binds, with one line naming the URL (its password hidden) and exit 1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TOKENS = "wtok:worker,ctok:client,atok:admin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(tmp_path: Path, *args: str, env_database: str | None = None) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RC_DATABASE", "RC_WEBHOOK_URL")}
    env["RC_TOKENS"] = TOKENS
    if env_database is not None:
        env["RC_DATABASE"] = env_database
    cmd = [sys.executable, "-c", "from resource_controller.cli.main import main; main()", "serve"]
    cmd += ["--addr", f"127.0.0.1:{_free_port()}", "--data", str(tmp_path / "data"), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode, proc.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("url", ["mysql://db/rc", "sqlite:///tmp/x.db", "http://db:5432/rc"])
def test_a_url_of_another_scheme_is_refused_naming_it(tmp_path: Path, url: str) -> None:
    code, err = _serve(tmp_path, "--database", url)
    scheme = url.split("://")[0]
    assert code == 1
    assert err.splitlines() == [
        f"rc: --database: {scheme}:// is not a database rc can use (a postgresql:// URL,"
        " or leave it unset for SQLite in the data directory)"
    ]


@pytest.mark.e2e
def test_an_unreachable_server_stops_it_with_one_line_hiding_the_password(
    tmp_path: Path,
) -> None:
    # Nothing listens on this socket directory: the connection is refused at once.
    url = f"postgresql://rc:s3cret@/rc?host={tmp_path}"
    code, err = _serve(tmp_path, env_database=url)
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith("rc: cannot reach the database postgresql://rc:***@/rc")
    assert "s3cret" not in err
