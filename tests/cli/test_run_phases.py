"""``rc run``'s state machine with a scripted client: the queue's give-ups, a broken log
stream, the bounded final wait (CLI-079, CLI-107, CLI-111, CLI-112, CLI-193)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from cli.conftest import Rc
from cli.test_hold import Scripted
from resource_controller import errors
from resource_controller.cli import common, jobs
from resource_controller.cli import run as run_machine
from resource_controller.client import api

RUNNING = {"id": "j1", "state": "running", "device_id": "box:gpu0", "started_at": "x"}


class ScriptedRun(Scripted):
    """``Scripted`` with the calls ``rc run`` adds: the submit, the output, the bounds."""

    def __init__(self, submitted: dict[str, Any], chunks: list[bytes], **answers: Any) -> None:
        super().__init__(submitted, **answers)
        self.chunks = chunks
        self.bounds: list[float | None] = []
        self.deadlines: list[float | None] = []

    def submit(self, command: list[str], **kw: Any) -> dict[str, Any]:
        return self._answer("submit", self.submitted)  # type: ignore[no-any-return]

    def output(self, job_id: str, **kw: Any) -> Iterator[bytes]:
        yield from self.chunks
        self._answer("stream_end", None)

    def wait_until_scheduled(self, job_id: str, **kw: Any) -> dict[str, Any]:
        self.deadlines.append(kw.get("deadline"))
        return super().wait_until_scheduled(job_id, **kw)

    def wait_until_terminal(self, job_id: str, **kw: Any) -> dict[str, Any]:
        self.bounds.append(kw.get("bound"))
        return super().wait_until_terminal(job_id, **kw)


class GiveUpAfterDeadline(ScriptedRun):
    """Polls that fail until just past the deadline ``rc`` handed over, then give up."""

    def wait_until_scheduled(self, job_id: str, **kw: Any) -> dict[str, Any]:
        deadline = kw["deadline"]
        assert deadline is not None and deadline - time.monotonic() < 1
        while time.monotonic() < deadline:
            time.sleep(0.005)
        raise api.PollGiveUp(f"gave up polling job {job_id}")


def wait_queue(client: Scripted, timeout: float) -> api.Json:
    return run_machine.wait_queue(client, "j1", "box:gpu0", timeout=timeout)  # type: ignore[arg-type]


# ---- CLI-079, CLI-107: the queue wait decides "my --timeout passed" by the clock ------------


@pytest.mark.parametrize(
    "error",
    [
        api.PollGiveUp("gave up polling job j1 after 17 failed polls (last error: timed out)"),
        # A per-poll timeout reads like a deadline error; the clock still says no.
        api.WaitTimeout("GET /v1/jobs/j1: deadline exceeded"),
    ],
)
def test_a_give_up_before_my_timeout_loses_track_and_kills_nothing(
    error: errors.ClientError,
) -> None:
    client = ScriptedRun({"id": "j1", "state": "queued"}, [], scheduled=error)
    with pytest.raises(common.Failure) as info:
        wait_queue(client, timeout=600)  # CLI-079, CLI-107
    text = str(info.value)
    assert text.startswith("lost track of job j1 while it was queued"), text
    assert str(error) in text and "still be queued" in text and "rc ps" in text
    assert client.kills == []
    [deadline] = client.deadlines
    assert deadline is not None and 590 < deadline - time.monotonic() <= 600


def test_a_give_up_after_my_timeout_cancels_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    client = GiveUpAfterDeadline({"id": "j1", "state": "queued"}, [])
    with pytest.raises(common.Failure) as info:
        wait_queue(client, timeout=0.05)  # CLI-079, CLI-107
    assert str(info.value) == "gave up waiting for box:gpu0 (deadline exceeded)"
    assert [job_id for job_id, _ in client.kills] == ["j1"]
    assert "cancelled queued job j1" in capsys.readouterr().err


def test_no_timeout_hands_no_deadline_and_a_give_up_loses_track() -> None:
    client = ScriptedRun({"id": "j1", "state": "queued"}, [], scheduled=api.PollGiveUp("x"))
    with pytest.raises(common.Failure, match="lost track of job j1"):
        wait_queue(client, timeout=0)  # CLI-079
    assert client.deadlines == [None] and client.kills == []


# ---- through the command: stdout, stderr, the exit code --------------------------------------


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[ScriptedRun]:
    """``rc run`` talks to the client the test puts in this list."""
    clients: list[ScriptedRun] = []
    monkeypatch.setattr(jobs, "_client", lambda as_flag="": clients[0])
    return clients


def rc_run(run_rc: Rc) -> Any:
    return run_rc("run", "-d", "box:gpu0", "--", "train")


def test_a_broken_stream_keeps_its_bytes_then_waits_for_the_jobs_code(
    run_rc: Rc, scripted: list[ScriptedRun]
) -> None:
    broke = errors.TransportError("GET /v1/jobs/j1/logs: connection reset by peer")
    ended = {"id": "j1", "state": "failed", "exit_code": 3}
    scripted.append(
        ScriptedRun(RUNNING, [b"epoch 1\n", b"epoch 2 \xff"], stream_end=broke, terminal=ended)
    )
    result = rc_run(run_rc)
    assert result.exit_code == 3, result.stderr  # CLI-111: the job's own code, after the wait
    assert result.stdout_bytes == b"epoch 1\nepoch 2 \xff"
    assert result.stderr.splitlines() == [
        "rc: job j1 on box:gpu0",
        f"rc: log stream ended: {broke}",
    ]
    assert scripted[0].bounds == [run_machine.FINAL_WAIT]


def test_the_final_wait_is_bounded_at_five_minutes(run_rc: Rc, scripted: list[ScriptedRun]) -> None:
    expired = api.WaitTimeout("job j1 did not finish within 5m0s (last known state: running)")
    scripted.append(ScriptedRun(RUNNING, [b"out\n"], terminal=expired))
    result = rc_run(run_rc)
    assert run_machine.FINAL_WAIT == 300.0  # CLI-193
    assert scripted[0].bounds == [300.0]  # CLI-112
    assert result.exit_code == 1
    assert result.stdout == "out\n"
    assert result.stderr.splitlines()[1:] == [f"rc: {expired}"]


def test_a_give_up_in_the_final_wait_is_one_line_and_kills_nothing(
    run_rc: Rc, scripted: list[ScriptedRun]
) -> None:
    gone = api.PollGiveUp(
        "gave up waiting for job j1 after 6 consecutive failed polls"
        " (last known state: running; last error: connection refused)"
    )
    scripted.append(ScriptedRun(RUNNING, [], terminal=gone))
    result = rc_run(run_rc)
    assert result.exit_code == 1  # CLI-112
    assert result.stderr == f"rc: job j1 on box:gpu0\nrc: {gone}\n"
    assert scripted[0].kills == []
