"""``rc drain`` / ``rc undrain`` and how ``rc devices`` and ``rc describe`` show a draining
device, against a live controller (EXT-DRAIN-1, EXT-DRAIN-3a)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cli.conftest import Rc
from client.live import ADMIN, CLIENT, FakeWorker, LiveController
from resource_controller import errors
from resource_controller.client import api, waits


@pytest.fixture
def admin_env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": ADMIN, "RC_SUBMITTER": "ops"}


@pytest.fixture
def client_env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "alice"}


def device(controller: LiveController, device_id: str) -> dict[str, Any]:
    views = controller.http().request("GET", "/v1/devices").json()
    found: dict[str, Any] = next(v["device"] for v in views if v["device"]["id"] == device_id)
    return found


def test_drain_names_each_device_and_sends_who_and_why(
    run_rc: Rc, admin_env: dict[str, str], controller: LiveController, worker: FakeWorker
) -> None:
    result = run_rc("drain", "box:gpu0", "--reason", "driver upgrade", env=admin_env)
    assert (result.exit_code, result.stdout) == (0, "draining box:gpu0\n"), result.stderr
    got = device(controller, "box:gpu0")
    assert (got["draining"], got["drained_by"], got["drain_reason"]) == (
        True,
        "ops",
        "driver upgrade",
    )
    assert "draining" not in device(controller, "box:gpu1")


def test_devices_and_describe_show_the_drain(
    run_rc: Rc,
    admin_env: dict[str, str],
    client_env: dict[str, str],
    worker: FakeWorker,
) -> None:
    assert run_rc("drain", "box:gpu0", "--reason", "fan swap", env=admin_env).exit_code == 0
    table = run_rc("devices", env=client_env).stdout.splitlines()
    assert table[1].split()[:3] == ["box:gpu0", "ready", "(draining)"]
    assert "draining" not in table[2]
    described = run_rc("describe", "box:gpu0", env=client_env).stdout.splitlines()
    assert described[0].split() == ["box:gpu0", "ready"]
    assert described[1].split(None, 1) == ["draining", "fan swap, by ops"]


def test_host_drains_and_undrains_every_device_of_the_host(
    run_rc: Rc, admin_env: dict[str, str], controller: LiveController, worker: FakeWorker
) -> None:
    other = FakeWorker(controller, host="other", devices=("gpu0",))
    try:
        result = run_rc("drain", "--host", "box", env=admin_env)
        assert result.stdout == "draining box:gpu0\ndraining box:gpu1\n", result.stderr
        assert "draining" not in device(controller, "other:gpu0")
        result = run_rc("undrain", "--host", "box", env=admin_env)
        assert result.stdout == "undrained box:gpu0\nundrained box:gpu1\n", result.stderr
        assert "draining" not in device(controller, "box:gpu0")
    finally:
        other.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("drain",), "name at least one device, or --host HOST"),
        (("drain", "box:gpu0", "--host", "box"), "give device IDs or --host, not both"),
        (("undrain",), "name at least one device, or --host HOST"),
        (("drain", "--host", "nowhere"), "no device is registered on host 'nowhere'"),
        (("drain", "box:gpu9"), "not_found"),
        (("undrain", "box:gpu9"), "not_found"),
    ],
)
def test_bad_requests_are_one_line_and_exit_1(
    run_rc: Rc, admin_env: dict[str, str], worker: FakeWorker, args: tuple[str, ...], message: str
) -> None:
    result = run_rc(*args, env=admin_env)
    assert result.exit_code == 1
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_a_client_token_is_forbidden(
    run_rc: Rc, client_env: dict[str, str], worker: FakeWorker
) -> None:
    result = run_rc("drain", "box:gpu0", env=client_env)
    assert result.exit_code == 1 and "forbidden" in result.stderr


def test_wait_idle_returns_once_no_named_device_holds_a_lease(
    controller: LiveController,
) -> None:
    # EXT-DRAIN-3a: "--wait returns once no named device has a live lease". The polls
    # are counted through the injected sleep; the job ends at the third one.
    release = threading.Event()

    def hold_until_released(w: FakeWorker, a: dict[str, Any]) -> tuple[str, int | None, str]:
        release.wait(30)
        return ("succeeded", 0, "")

    fake = FakeWorker(controller, behaviour=hold_until_released)
    try:
        user = api.JsonClient(controller.url, CLIENT, submitter="alice")
        job = user.submit(["sleep"], device="box:gpu0")
        seen: list[list[str]] = []
        sleeps: list[float] = []

        def fake_sleep(seconds: float) -> None:
            sleeps.append(seconds)
            if len(sleeps) == 3:
                release.set()
                user.wait_until_terminal(str(job["id"]), bound=20)

        admin = api.JsonClient(controller.url, ADMIN, submitter="ops", sleep=fake_sleep)
        admin.device_action("box:gpu0", "drain", {"submitter": "root", "reason": "upgrade"})
        admin.wait_idle(
            ["box:gpu0", "box:gpu1"],
            on_wait=lambda held: seen.append([v["device"]["id"] for v in held]),
        )
        assert len(sleeps) == 3
        assert seen == [["box:gpu0"]]  # said once, not on every poll
    finally:
        release.set()
        fake.stop()


def test_wait_idle_gives_up_after_many_failed_polls() -> None:
    slept: list[float] = []
    client = api.JsonClient("http://127.0.0.1:9", ADMIN, sleep=slept.append)
    with pytest.raises(waits.PollGiveUp):
        client.wait_idle(["box:gpu0"])
    assert len(slept) == waits.SCHEDULED_GIVE_UP - 1
    assert isinstance(waits.PollGiveUp("x"), errors.ClientError)
