"""The Python API's ``after`` (EXT-SHARE-2, EXT-PYAPI-2): what it sends, what it refuses
before any request, and a pipeline run against a live controller."""

from __future__ import annotations

import asyncio

import pytest

from client.live import CLIENT, FakeWorker, LiveController, run_for_real
from resource_controller import AsyncClient, Client
from resource_controller.client import messages, options


def test_submit_body_sends_after_only_when_given() -> None:
    plain = messages.submit_body("me", ["x"])
    assert "after" not in plain and "after_any" not in plain
    body = messages.submit_body("me", ["x"], after=["a", "b"], after_any=True)
    assert body["after"] == ["a", "b"] and body["after_any"] is True


@pytest.mark.parametrize(
    ("after", "after_any", "no_wait", "expected"),
    [
        (None, False, False, []),
        ("abc123", False, False, ["abc123"]),
        ("abc123, def456,abc123", False, False, ["abc123", "def456"]),
        (["abc123", "def456"], True, False, ["abc123", "def456"]),
    ],
)
def test_after_ids(after: object, after_any: bool, no_wait: bool, expected: list[str]) -> None:
    assert options.after_ids(after, after_any, no_wait) == expected


@pytest.mark.parametrize(
    ("after", "after_any", "no_wait", "error", "words"),
    [
        (None, True, False, ValueError, "after_any needs after"),
        ("abc123", False, True, ValueError, "cannot be used together"),
        (["abc123", ""], False, False, ValueError, "empty job ID"),
        ([f"j{i}" for i in range(65)], False, False, ValueError, "at most 64"),
        (42, False, False, TypeError, "job IDs or jobs"),
        ([42], False, False, TypeError, "job IDs or jobs"),
    ],
)
def test_after_is_refused_before_any_request(
    after: object, after_any: bool, no_wait: bool, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        options.after_ids(after, after_any, no_wait)


def test_a_pipeline_runs_in_order(controller: LiveController, worker: FakeWorker) -> None:
    worker.behaviour = run_for_real
    with Client(controller.url, CLIENT, submitter="me") as rc:
        first = rc.submit(["sleep", "0.5"], device="box:gpu0")
        second = rc.submit(["echo", "second"], after=first)  # a handle
        third = rc.run(["echo", "third"], after=[second.id[:8]], capture=True)  # a prefix
        assert third.exit_code == 0 and third.output == b"third\n"
        assert second.raw["after"] == [first.id]
        for job in (first, second):
            job.refresh()
            assert job.state == "succeeded"
        assert first.finished_at is not None and second.started_at is not None
        assert second.started_at >= first.finished_at


def test_a_failed_dependency_ends_the_run_with_its_reason(
    controller: LiveController, worker: FakeWorker
) -> None:
    worker.behaviour = run_for_real

    async def go() -> None:
        async with AsyncClient(controller.url, CLIENT, submitter="me") as rc:
            first = await rc.submit(["false"], device="box:gpu0")
            result = await rc.run(["echo", "never"], after=first.id, capture=True)
            assert result.exit_code == 1 and result.output == b""
            assert result.job.kill_reason == f"dependency_failed: {first.id}"
            assert result.job.after == [first.id]

    asyncio.run(go())
