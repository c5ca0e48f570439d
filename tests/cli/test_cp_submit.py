"""``rc cp``'s copy job: how it is submitted and how long it is awaited (CLI-163, CLI-195)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.conftest import Spawn
from client.live import CLIENT, WORKER, FakeWorker, LiveController
from resource_controller import errors
from resource_controller.cli import common, cp
from resource_controller.client import api, waits


def quarantine(controller: LiveController) -> None:
    """box:gpu0 free (no holder) but out of the pool: the lease check passes, the submit
    finds nothing to give, as if someone took the device in between."""
    controller.http(WORKER).request(
        "POST", "/v1/devices/box:gpu0/fault", body={"reason": "fan stuck"}
    )


def test_a_device_gone_after_the_check_is_refused_not_queued(
    spawn_rc: Spawn, worker: FakeWorker, controller: LiveController, tmp_path: Path
) -> None:
    quarantine(controller)
    (tmp_path / "f").write_text("x")
    env = {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "tester"}
    # A process of its own, bounded: a copy job that queued would wait for ever.
    result = spawn_rc("cp", str(tmp_path / "f"), f"box:gpu0:{tmp_path}/remote/", env=env).result(15)
    assert result.exit_code == 1  # CLI-163
    assert result.stderr == "rc: box:gpu0 was taken between the check and the copy request\n"
    # What went on the wire, as the controller recorded the refused submit: a pinned pipe
    # job that refused to queue (no_wait), with a key of its own.
    [job] = api.JsonClient(controller.url, CLIENT).jobs()
    assert job["stdio"] == "pipe" and job["device_id"] == "box:gpu0"
    assert job["state"] == "killed" and job["kill_reason"].startswith("no-wait:")
    assert job["command"] == ["/bin/sh", "-c", cp.UPLOAD_SCRIPT, f"{tmp_path}/remote"]
    assert job["submitter"] == "tester" and job["idempotency_key"]
    assert not (tmp_path / "remote").exists()


def test_the_race_is_its_own_error_type(
    worker: FakeWorker, controller: LiveController, tmp_path: Path
) -> None:
    quarantine(controller)
    client = api.JsonClient(controller.url, CLIENT, submitter="tester")
    with pytest.raises(errors.DeviceHeldByAnother) as info:
        cp.copy(client, f"box:gpu0:{tmp_path}/f", str(tmp_path / "g"))  # CLI-163
    assert isinstance(info.value.__cause__, errors.NoDeviceError)
    [job] = client.jobs()
    assert job["stdio"] == "pipe" and job["kill_reason"].startswith("no-wait:")


@pytest.mark.parametrize(
    "error",
    [
        waits.WaitTimeout("job c1 did not finish within 30m0s (last known state: running)"),
        waits.PollGiveUp("gave up waiting for job c1 after 6 consecutive failed polls"),
    ],
)
def test_the_copy_job_is_awaited_thirty_minutes_at_most(error: errors.ClientError) -> None:
    bounds: list[float | None] = []

    class Waiting:
        def wait_until_terminal(self, job_id: str, *, bound: float | None = None) -> None:
            bounds.append(bound)
            raise error

    with pytest.raises(common.Failure) as info:
        cp._finish(Waiting(), "c1")  # type: ignore[arg-type]
    assert cp.COPY_WAIT == 1800.0  # CLI-195
    assert bounds == [1800.0] and str(info.value) == str(error)
