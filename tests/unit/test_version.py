"""The cheap version lookup agrees with ``importlib.metadata`` or defers to it (EXT-CLI-8)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from resource_controller import version


def _dist_info(where: Path, name: str, text: str) -> None:
    d = where / name
    d.mkdir(parents=True)
    (d / "METADATA").write_text(text)


def test_the_installed_version_matches_the_metadata_library() -> None:
    assert version.installed_version() == metadata.version(version.DIST_NAME)
    assert version._from_dist_info(sys.path) == metadata.version(version.DIST_NAME)


def test_the_first_directory_holding_the_package_wins(tmp_path: Path) -> None:
    _dist_info(tmp_path / "a", "resource_controller-1.2.3.dist-info", "Name: x\nVersion: 1.2.3\n")
    _dist_info(tmp_path / "b", "resource_controller-9.9.dist-info", "Version: 9.9\n")
    path = [str(tmp_path / "missing"), str(tmp_path / "a"), str(tmp_path / "b")]
    assert version._from_dist_info(path) == "1.2.3"


def test_unusual_layouts_defer_to_the_library(tmp_path: Path) -> None:
    two = tmp_path / "two"
    _dist_info(two, "resource_controller-1.0.dist-info", "Version: 1.0\n")
    _dist_info(two, "resource_controller-2.0.dist-info", "Version: 2.0\n")
    egg = tmp_path / "egg"
    (egg / "resource_controller-1.0.egg-info").mkdir(parents=True)
    headerless = tmp_path / "headerless"
    _dist_info(headerless, "resource_controller-1.0.dist-info", "Name: x\n\nVersion: 1.0\n")
    a_zip = tmp_path / "lib.zip"
    a_zip.write_bytes(b"PK")
    for entry in (two, egg, headerless, a_zip):
        assert version._from_dist_info([str(entry)]) is None, entry
    assert version._from_dist_info([str(tmp_path / "empty")]) is None


def test_rc_version_does_not_import_the_metadata_library() -> None:
    code = (
        "import sys\n"
        "from resource_controller.cli import main\n"
        "print(main.installed_version(), 'importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [metadata.version(version.DIST_NAME), "False"]
