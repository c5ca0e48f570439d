"""``rc up --devices N``: a count out of range is refused before anything starts, and the
largest one accepted is a registration the controller takes (EXT-UP-2, EXT-LIMITS-2)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from client.live import CLIENT, WORKER, LiveController
from resource_controller.cli import serve
from resource_controller.core import limits
from resource_controller.worker import agent, channel
from resource_controller.worker import config as worker_config

RC = Path(sys.executable).parent / "rc"
LOW, HIGH = serve.UP_DEVICES

#: The longest host name Linux gives (HOST_NAME_MAX): the registration's one per-host string.
LONGEST_HOST = "h" * 64


@pytest.mark.parametrize("count", [0, -1, HIGH + 1, 100_000])
def test_a_count_out_of_range_names_the_flag_and_the_range(count: int) -> None:
    with pytest.raises(click.UsageError) as refused:
        serve.check_up_devices(count)
    assert str(refused.value) == f"--devices must be in {LOW}..{HIGH}, got {count}"


@pytest.mark.parametrize("count", [LOW, 2, HIGH])
def test_a_count_in_range_passes(count: int) -> None:
    serve.check_up_devices(count)


def up_registration(count: int, state_dir: Path) -> dict[str, Any]:
    """The body ``rc up``'s worker would register ``slot0..`` with: its own code, its probes."""
    names = [f"slot{i}" for i in range(count)]
    config = worker_config.make_config(
        "http://127.0.0.1:9", names, token=WORKER, host=LONGEST_HOST, state_dir=str(state_dir)
    )
    worker = agent.Agent(config)
    facts = asyncio.run(worker.gather_facts())
    return channel.registration_body(worker.registration(facts))


def test_the_largest_count_registers(controller: LiveController, tmp_path: Path) -> None:
    body = up_registration(HIGH, tmp_path / "worker")
    # As the test client sends it (JSON with spaces): more bytes than the worker's compact
    # form, so the ceiling holds with a margin.
    assert len(json.dumps(body).encode()) <= limits.BODY_BYTES
    answer = controller.http(WORKER).request("POST", "/v1/workers/register", body=body, timeout=60)
    assert answer.json()["worker_id"]
    devices = controller.http(CLIENT).request("GET", "/v1/devices", timeout=60).json()
    assert len(devices) == HIGH


@pytest.mark.parametrize("value", ["0", "-1", str(HIGH + 1)])
def test_rc_up_refuses_at_once_and_starts_nothing(value: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "RC_CONFIG": str(tmp_path / "config.yaml"),
    }
    done = subprocess.run(
        [str(RC), "up", "--data", str(data), "--addr", "127.0.0.1:0", "--devices", value],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"rc: --devices must be in {LOW}..{HIGH}, got {int(value)}\n"
    assert not data.exists() and not (tmp_path / "config.yaml").exists()
