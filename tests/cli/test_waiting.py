"""``rc run``, ``rc hold`` and ``rc ps`` say what a queued job waits for (EXT-WHY-2)."""

from __future__ import annotations

import re
import time

import pytest

from cli.conftest import Rc, Spawn
from cli.test_hold import play_hold
from cli.test_live import occupy, wait_state
from client.live import ADMIN, CLIENT, WORKER, FakeWorker, LiveController, run_for_real
from resource_controller.client import api

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


@pytest.fixture
def env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "tester"}


@pytest.fixture
def client(controller: LiveController) -> api.JsonClient:
    return api.JsonClient(controller.url, CLIENT, submitter="tester")


def hold_for(client: api.JsonClient, worker: FakeWorker, who: str, ttl: int = 1800) -> str:
    """A hold by ``who`` with reason "profiling", granted on box:gpu0."""
    worker.behaviour = play_hold
    other = api.JsonClient(client._http.base_url, CLIENT, submitter=who)
    h = other.submit(None, device="box:gpu0", kind="hold", max_runtime=ttl, reason="profiling")
    wait_state(client, h["id"], "running")
    return str(h["id"])


def test_run_prints_the_holder_then_again_when_the_blocker_changes(
    spawn_rc: Spawn,
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
    controller: LiveController,
) -> None:
    blocker = occupy(client, worker, who="alice")
    background = spawn_rc("run", "-d", "box:gpu0", "--", "echo", "mine", env=env)
    background.said("queued at position 1")
    time.sleep(1.2)  # a few queue polls: the blocker is unchanged, nothing is printed again
    # The device is quarantined under the running job: same position, new blocker.
    controller.http(WORKER).request(
        "POST", "/v1/devices/box:gpu0/fault", body={"reason": "fan stuck"}
    )
    background.said("queued at position 1", times=2)
    admin = api.JsonClient(controller.url, ADMIN, submitter="tester")
    admin.kill(blocker)  # the lease goes; the device stays out of the pool
    wait_state(client, blocker, "killed")
    background.said("queued at position 1", times=3)
    worker.behaviour = run_for_real
    controller.http(ADMIN).request("POST", "/v1/devices/box:gpu0/clear")
    result = background.result(15)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    prefix = "rc: queued at position 1 for box:gpu0 — "
    assert all(line.startswith(prefix) for line in lines[:3]), lines
    held = f"held by alice (job {blocker[:8]}…) for "
    out = "out of the pool: unhealthy (fan stuck) — an operator must clear it (rc clear box:gpu0)"
    assert re.fullmatch(re.escape(prefix + held) + r"\d+s", lines[0])
    assert re.fullmatch(re.escape(prefix + held) + r"\d+s, " + re.escape(out), lines[1])
    assert lines[2] == prefix + out
    assert lines[3].startswith("rc: job ") and len(lines) == 4
    assert result.stdout == "mine\n"


def test_hold_queued_behind_a_hold_names_its_holder_reason_and_end(
    run_rc: Rc,
    spawn_rc: Spawn,
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
) -> None:
    # ``rc hold`` shares ``rc run``'s queue wait (CLI-122 = CLI-106).
    first = hold_for(client, worker, "alice")
    background = spawn_rc("hold", "box:gpu0", "--ttl", "1s", "--reason", "mine", env=env)
    background.said("queued at position 1")
    ps = run_rc("ps", env=env).stdout.splitlines()
    api.JsonClient(client._http.base_url, CLIENT, submitter="alice").kill(first)
    result = background.result(15)
    line = result.stderr.splitlines()[0]
    assert re.fullmatch(
        rf"rc: queued at position 1 for box:gpu0 — held by alice \(job {first[:8]}…, hold"
        rf' "profiling"\) for \d+s, at most until {RFC3339}',
        line,
    ), line
    # rc ps: the last column says what each queued job waits for (CLI-146, EXT-WHY-2).
    assert ps[0].split()[-2:] == ["WAITING", "FOR"]
    queued = next(row for row in ps if "queued (#1)" in row)
    assert queued.rstrip().endswith('alice (hold "profiling")')
    assert queued.index("alice (hold") == ps[0].index("WAITING FOR")


def test_ps_waiting_for_a_selector_job_names_each_device(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    a = occupy(client, worker, "box:gpu0", who="alice")
    b = occupy(client, worker, "box:gpu1", who="bob")
    client.submit(["true"])  # any device (EXT-CLI-1)
    ps = run_rc("ps", env=env).stdout.splitlines()
    row = ps[-1]
    assert row.rstrip().endswith(f"box:gpu0 alice (job {a[:8]}…); box:gpu1 bob (job {b[:8]}…)"), ps


def test_ps_without_waiting_information_keeps_the_base_table(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker
) -> None:
    assert run_rc("ps", env=env).stdout.split() == [
        "JOB",
        "DEVICE",
        "STATE",
        "SUBMITTER",
        "COMMAND",
    ]
