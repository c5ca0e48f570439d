"""The install an operator gets: ``python -m build``, then ``pip install`` into a fresh venv.

The wheel is built from this checkout (sdist first, then the wheel from the sdist, as
``python -m build`` does), installed with its dependencies from the package index into
a new virtual environment, and then used from there only: ``rc --version``, the help
pages, and a real ``rc serve`` answering ``/healthz`` and serving the dashboard, which
proves the migrations and the static files travelled inside the wheel.

It needs the package index (pip's cache makes a rerun quick); ``make test`` runs it,
``make test-fast`` does not (it is ``e2e`` by its place).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .cluster import free_port, stop, wait_for

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "resource_controller"
#: Bounds on each step: generous for a cold pip cache on a slow link, finite all the same.
BUILD_TIMEOUT = 300
INSTALL_TIMEOUT = 480


@dataclass(frozen=True)
class Installed:
    """A fresh venv holding the built wheel and its dependencies."""

    wheel: Path
    venv: Path

    @property
    def rc(self) -> Path:
        return self.venv / "bin" / "rc"


def _quiet_env(home: Path | None = None) -> dict[str, str]:
    """The caller's environment without this checkout's venv, so nothing leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RC_", "VIRTUAL_ENV"))}
    dev_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != dev_bin)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PYTHONPATH", None)
    if home is not None:
        env["HOME"] = str(home)
        env["XDG_CONFIG_HOME"] = str(home / ".config")
    return env


def _check(argv: list[str], timeout: float, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    env = _quiet_env()
    dist = base / "dist"
    _check(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
        BUILD_TIMEOUT,
        base,
        env,
    )
    wheels = sorted(dist.glob("resource_controller-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {dist}: {wheels}"
    venv = base / "venv"
    # The interpreter that runs the tests, but not its venv: a new one, with its own pip.
    base_python = getattr(sys, "_base_executable", sys.executable)
    _check([base_python, "-m", "venv", str(venv)], 120, base, env)
    _check(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheels[0])],
        INSTALL_TIMEOUT,
        base,
        env,
    )
    yield Installed(wheel=wheels[0], venv=venv)


def _declared_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def test_the_wheel_carries_every_file_of_the_package(installed: Installed) -> None:
    # Static pages, migration templates, py.typed: every file under the package in the
    # source tree is in the wheel, so a new data file cannot be left behind unnoticed.
    with zipfile.ZipFile(installed.wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "rc = resource_controller.cli.main:main" in zf.read(entry_points).decode()
    wanted = {
        str(p.relative_to(PACKAGE.parent))
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    for must in (
        "resource_controller/py.typed",
        "resource_controller/controller/static/dashboard.html",
        "resource_controller/store/migrations/script.py.mako",
    ):
        assert must in wanted, f"{must} is no longer in the source tree; update this test"
    assert wanted - names == set()


def test_installed_rc_reports_its_version_and_help(installed: Installed, tmp_path: Path) -> None:
    env = _quiet_env(home=tmp_path)
    where = _check(
        [
            str(installed.venv / "bin" / "python"),
            "-c",
            "import resource_controller as m; print(m.__file__)",
        ],
        60,
        tmp_path,
        env,
    )
    assert Path(where.strip()).is_relative_to(installed.venv), where
    assert _check([str(installed.rc), "--version"], 60, tmp_path, env) == (
        f"rc {_declared_version()}\n"
    )
    top = _check([str(installed.rc), "--help"], 60, tmp_path, env)
    for command in ("run", "hold", "serve", "worker", "help"):
        assert f"  {command} " in top, top
    serve_help = _check([str(installed.rc), "serve", "--help"], 60, tmp_path, env)
    assert "--data" in serve_help and "RC_TOKENS" in serve_help, serve_help


def test_installed_controller_migrates_and_serves_the_dashboard(
    installed: Installed, tmp_path: Path
) -> None:
    port = free_port()
    env = _quiet_env(home=tmp_path)
    env["RC_TOKENS"] = "wtok:worker,ctok:client,atok:admin"
    data = tmp_path / "data"
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [str(installed.rc), "serve", "--addr", f"127.0.0.1:{port}", "--data", str(data)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def get(path: str) -> tuple[int, str] | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()
            except OSError:
                return None

        status, body = wait_for(lambda: get("/healthz"), 30, "the installed controller")
        assert (status, body.strip()) == (200, '{"status":"ok","leader":true}')
        status, page = get("/") or (0, "")
        assert status == 200
        # The page inlines its style and script from controller/static/.
        for name in ("dashboard.js", "dashboard.css"):
            assert (PACKAGE / "controller" / "static" / name).read_text() in page, name
        assert (data / "rc.db").is_file()
    finally:
        code = stop(proc, signal.SIGTERM, timeout=15)
    assert code == 0, (tmp_path / "serve.log").read_text()


def test_installed_rc_mcp_without_the_extra_says_how_to_add_it(
    installed: Installed, tmp_path: Path
) -> None:
    # The venv holds the wheel without its mcp extra: the SDK is really missing. Not a
    # checkout, so the advice leads with the wheel (by its name) and this venv's Python.
    done = subprocess.run(
        [str(installed.rc), "mcp"],
        cwd=tmp_path,
        env=_quiet_env(home=tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == "", done
    pip = str(installed.venv / "bin" / "python")
    assert f"-m pip install 'dist/{installed.wheel.name}[mcp]'" in done.stderr, done.stderr
    assert "-m pip install -e '<checkout>[mcp]'" in done.stderr, done.stderr
    assert pip in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
