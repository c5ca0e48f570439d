"""``rc run`` through the command, over a scripted controller on the client's own
transport: what it prints where and how it exits when the stream breaks, when a
submit meets a database outage, and when contact is lost (CLI-110..114, CLI-193)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cli.conftest import Rc
from client.fake_controller import FakeController
from client.test_api import FakeTime
from resource_controller import errors
from resource_controller.cli import run as run_cli
from resource_controller.client import api, machine, transport

RUNNING = {"id": "j1", "state": "running", "device_id": "box:gpu0", "started_at": "t"}


def ended(code: int) -> dict[str, Any]:
    return {"job": {**RUNNING, "state": "failed", "exit_code": code}}


def cut(chunks: list[bytes]) -> Iterator[bytes]:
    yield from chunks
    raise errors.TransportError("reset")


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """``rc run`` talks to a fake controller answering ``METHOD path`` from these lists
    (the last answer repeats), on a fake clock."""
    routes: dict[str, list[Any]] = {}

    def reply(method: str, path: str, kw: dict[str, Any]) -> Any:
        found = routes[f"{method} {path}"]
        answer = found.pop(0) if len(found) > 1 else found[0]
        return answer() if callable(answer) else answer

    clock = FakeTime()

    def client(as_flag: str = "") -> api.JsonClient:
        http = transport.Transport("http://ctl.test", "t", opener=FakeController(reply).open)
        return api.JsonClient(
            http=http, submitter="me", sleep=clock.sleep, monotonic=clock.monotonic
        )

    monkeypatch.setattr(run_cli, "_client", client)
    return routes


def test_a_broken_stream_keeps_its_bytes_then_ends_with_the_jobs_code(
    run_rc: Rc, answers: dict[str, list[Any]]
) -> None:
    answers["POST /v1/jobs"] = [RUNNING]
    answers["GET /v1/jobs/j1/logs"] = [
        lambda: cut([b"epoch 1\n", b"epoch 2 \xff"]),
        lambda: iter([b"3\n"]),
    ]
    answers["GET /v1/jobs/j1"] = [ended(3)]
    result = run_rc("run", "-d", "box:gpu0", "--", "train")
    assert result.exit_code == 3, result.stderr  # the job's own code (CLI-114)
    assert result.stdout_bytes == b"epoch 1\nepoch 2 \xff3\n"  # nothing lost or repeated
    lines = result.stderr.splitlines()
    assert lines[0] == "rc: job j1 on box:gpu0"  # CLI-110 [format]
    assert len(lines) == 1  # resumed at once: nothing to say (EXT-CLI-5)


def test_a_submit_through_a_database_outage_waits_says_so_once_and_runs(
    run_rc: Rc, answers: dict[str, list[Any]]
) -> None:
    down = errors.api_error("store_error", "database unavailable", 500)
    answers["POST /v1/jobs"] = [down, down, down, RUNNING]
    answers["GET /v1/jobs/j1/logs"] = [lambda: iter([b"ok\n"])]
    answers["GET /v1/jobs/j1"] = [ended(9)]
    result = run_rc("run", "--", "train")
    assert result.exit_code == 9, result.stderr
    said = [line for line in result.stderr.splitlines() if "trying again" in line]
    assert len(said) == 1 and "store_error" in said[0]


def test_losing_contact_exits_75_and_says_where_the_result_will_be(
    run_rc: Rc, answers: dict[str, list[Any]]
) -> None:
    answers["POST /v1/jobs"] = [RUNNING]
    answers["GET /v1/jobs/j1/logs"] = [lambda: cut([b"partial\n"]), errors.TransportError("reset")]
    answers["GET /v1/jobs/j1"] = [errors.TransportError("reset")]
    result = run_rc("run", "--", "train")
    assert result.exit_code == machine.EXIT_LOST == 75
    assert result.stdout == "partial\n"
    last = result.stderr.splitlines()[-1]
    assert last.startswith("rc: lost contact with job j1")
    assert "rc jobs" in last and "rc logs j1" in last


def test_the_final_wait_is_bounded_at_five_minutes() -> None:
    assert machine.FINAL_WAIT == 300.0  # CLI-193
