"""The data directory is its owner's alone: 0700, and every file in it 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from resource_controller.controller import serve
from resource_controller.controller.deps import Settings


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_data_directory_and_its_files_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    svc = serve.open_services(data, "wtok:worker,ctok:client", Settings())
    try:
        svc.logs.append("job-1", b"a secret the job printed\n")
        assert mode(data) == 0o700
        assert mode(data / "logs") == 0o700
        files = [p for p in data.rglob("*") if p.is_file()]
        assert data / "rc.db" in files and any(p.suffix == ".log" for p in files), files
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    finally:
        svc.executor.shutdown(wait=True)
        svc.store.close()


def test_an_existing_open_data_directory_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    os.chmod(data, 0o755)
    os.chmod(data / "logs", 0o755)
    (data / "rc.db").touch()
    os.chmod(data / "rc.db", 0o644)
    svc = serve.open_services(data, "wtok:worker,ctok:client", Settings())
    try:
        assert (mode(data), mode(data / "logs"), mode(data / "rc.db")) == (0o700, 0o700, 0o600)
    finally:
        svc.executor.shutdown(wait=True)
        svc.store.close()
