"""``rc up``'s defaults: where it keeps its state, where it listens (EXT-UP-1, EXT-UP-5)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli.conftest import Rc
from e2e.cluster import RC, free_port, stop, wait_for
from resource_controller import local
from resource_controller.controller import serve as controller


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"XDG_DATA_HOME": "/xdg", "HOME": "/home/al"}, "/xdg/rc"),
        ({"HOME": "/home/al"}, "/home/al/.local/share/rc"),
        ({"XDG_DATA_HOME": "", "HOME": "/home/al"}, "/home/al/.local/share/rc"),
    ],
)
def test_the_state_directory_is_xdg_data_home_else_local_share(
    env: dict[str, str], expected: str
) -> None:
    assert local.default_data_dir(env) == Path(expected)  # EXT-UP-1


def test_rc_up_without_data_keeps_its_state_under_xdg_data_home(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_DATA_HOME=str(tmp_path / "xdg"),
        RC_CONFIG=str(tmp_path / "config.yaml"),
    )
    up = subprocess.Popen(
        [RC, "up", "--addr", f"127.0.0.1:{free_port()}", "--devices", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for((tmp_path / "config.yaml").exists, 30, "rc up to be ready")
    finally:
        assert stop(up, signal.SIGINT, timeout=30) == 0
    banner = up.stderr.read().decode() if up.stderr else ""
    state = tmp_path / "xdg" / "rc"
    assert f"(data {state})" in banner, banner  # EXT-UP-1
    assert (state / local.TOKENS_FILE).is_file() and (state / "rc.db").is_file()
    assert not (tmp_path / "home" / ".local").exists()


def test_rc_up_listens_on_loopback_port_8080_unless_told(
    run_rc: Rc, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[Any, ...]] = []

    def recorded(*args: Any) -> int:
        started.append(args)
        return 0

    monkeypatch.setattr(local, "run", recorded)  # the arguments, not a server on 8080
    assert run_rc("up").exit_code == 0
    assert run_rc("up", "--addr", "0.0.0.0:9000").exit_code == 0
    [(data, addr, *_), (_, other, *_)] = started
    assert data is None  # the directory of EXT-UP-1
    assert addr == "127.0.0.1:8080" and other == "0.0.0.0:9000"  # EXT-UP-5
    assert controller.parse_addr(addr) == ("127.0.0.1", 8080)
