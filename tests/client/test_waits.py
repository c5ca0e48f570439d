"""The polling waits' and the output follow's rules, as operations with no I/O
(CLI-077..079, CLI-190..192, EXT-CLI-5, API-009)."""

from __future__ import annotations

from typing import Any

import pytest

from client.steps import Steps, Stream
from resource_controller import errors
from resource_controller.client import calls, waits


def view(state: str, position: int = 0) -> dict[str, Any]:
    return {"job": {"id": "j1", "state": state}, "queue_position": position}


def polled(state: str) -> calls.PolledJob:
    return calls.PolledJob({"id": "j1", "state": state}, 0, [])


def test_until_scheduled_ends_when_the_job_leaves_the_queue() -> None:
    wait = waits.Wait("j1", now=0.0)
    assert wait.timeout(0.0) == waits.SCHEDULED_POLL_TIMEOUT  # CLI-191
    assert not wait.reached(polled("queued"), 0.0)
    assert wait.reached(polled("running"), 0.0)
    assert wait.reached(polled("killed"), 0.0)  # terminal without starting: the caller checks
    assert wait.pause(0.0) == waits.POLL_INTERVAL  # CLI-190


def test_a_deadline_bounds_each_poll_and_each_pause_then_ends_the_wait() -> None:
    wait = waits.Wait("j1", now=0.0, deadline=10.0)
    assert wait.timeout(9.7) == pytest.approx(0.3)
    assert wait.pause(9.8) == pytest.approx(0.2)
    assert wait.pause(11.0) == 0.0
    with pytest.raises(waits.WaitTimeout, match="deadline exceeded"):
        wait.timeout(10.0)


def test_consecutive_failures_give_up_and_a_good_poll_resets_the_count() -> None:
    wait = waits.Wait("j1", now=0.0)
    down = errors.TransportError("refused")
    for _ in range(waits.SCHEDULED_GIVE_UP - 1):
        wait.failed(down, 0.0)
    wait.reached(polled("queued"), 0.0)
    for _ in range(waits.SCHEDULED_GIVE_UP - 1):
        wait.failed(down, 0.0)
    with pytest.raises(waits.PollGiveUp, match="after 17 consecutive failures"):
        wait.failed(down, 0.0)


def test_until_terminal_names_the_bound_and_the_last_known_state() -> None:
    wait = waits.Wait("j1", terminal=True, now=100.0, deadline=400.0, bound=300.0)
    assert wait.timeout(100.0) == waits.TERMINAL_POLL_TIMEOUT  # CLI-192
    assert not wait.reached(polled("running"), 100.0)
    assert wait.reached(polled("succeeded"), 100.0)
    with pytest.raises(waits.WaitTimeout) as got:
        wait.timeout(400.0)
    assert str(got.value) == "job j1 did not finish within 5m0s (last known state: succeeded)"


def test_until_terminal_gives_up_after_six_failed_polls() -> None:
    wait = waits.Wait("j1", terminal=True, now=0.0)
    wait.reached(polled("running"), 0.0)
    for _ in range(waits.TERMINAL_GIVE_UP - 1):
        wait.failed(errors.TransportError("reset"), 0.0)
    with pytest.raises(waits.PollGiveUp, match="last known state: running; last error: reset"):
        wait.failed(errors.TransportError("reset"), 0.0)


def test_a_quiet_wait_goes_on_through_failures_until_nothing_was_heard_for_its_bound() -> None:
    wait = waits.Wait("j1", terminal=True, now=0.0, quiet=300.0)
    down = errors.TransportError("refused")
    for at in range(100):  # far more than six: an outage is waited out
        wait.failed(down, float(at))
    wait.reached(polled("running"), 100.0)  # heard again: the bound starts over
    wait.failed(down, 399.0)
    with pytest.raises(waits.LostContact, match=r"for 5m0s .*last known state: running") as got:
        wait.failed(down, 400.0)
    assert got.value.job_id == "j1" and isinstance(got.value, waits.PollGiveUp)


def test_a_wait_no_controller_even_connects_to_ends_sooner() -> None:
    # Every URL refused: none is running (rc up stopped), so 30 s, not 5 min (CLI-193).
    wait = waits.Wait("j1", terminal=True, now=0.0, quiet=300.0)
    gone = errors.ConnectFailed("connection refused")
    wait.failed(errors.TransportError("timed out"), 29.0)  # a frozen one: waited out
    with pytest.raises(waits.LostContact, match=r"for 30s "):
        wait.failed(gone, 30.0)
    steps = Steps(lambda step: gone)
    with pytest.raises(waits.LostContact, match="for 30s"):
        follow(steps, quiet=300.0)
    assert steps.now == pytest.approx(waits.GONE, abs=0.6)


@pytest.mark.parametrize(
    ("seconds", "text"), [(5, "5s"), (0.5, "0.5s"), (300, "5m0s"), (3725, "1h2m5s")]
)
def test_bounds_in_messages(seconds: float, text: str) -> None:
    assert waits.seconds_text(seconds) == text


def test_until_polls_at_the_interval_and_says_what_the_report_makes_of_each_view() -> None:
    answers = [view("queued", 2), view("queued", 2), view("queued", 1), view("running")]
    steps = Steps(lambda step: answers.pop(0))
    wait = waits.Wait("j1", now=0.0, report=lambda v: f"at {v.queue_position}")
    assert steps.run(waits.until(wait, steps.clock)).state == "running"
    assert steps.notes == ["at 2", "at 2", "at 1"]
    assert steps.now == pytest.approx(1.5)
    assert [c.timeout for c in steps.requests()] == [1.0] * 4


# ---- EXT-CLI-5: following a job's output -----------------------------------------------------


def follow(steps: Steps, quiet: float = waits.QUIET) -> None:
    steps.run(waits.follow("j1", steps.clock, quiet))


def test_a_broken_follow_reopens_at_the_offset_delivered_without_a_word() -> None:
    # A failover resumes at once: the user need not hear of it.
    reset = errors.Disconnected("GET logs: reset")
    streams = [Stream([b"abc", reset]), Stream([b"de", reset]), Stream([b"f", b""])]
    steps = Steps(lambda step: streams.pop(0))
    follow(steps)
    assert b"".join(steps.out) == b"abcdef"
    assert [o.query for o in steps.opened()] == [None, {"offset": "3"}, {"offset": "5"}]
    assert steps.notes == []


def test_a_follow_broken_for_longer_says_so_once() -> None:
    reset = errors.Disconnected("GET logs: reset")
    refused = errors.Disconnected("GET logs: connection refused")
    down = [refused] * 12  # 12 tries 0.5 s apart: 6 s without a stream
    answers: list[Any] = [Stream([b"abc", reset]), *down, Stream([b"d", b""])]

    def answer(step: object) -> Any:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    steps = Steps(answer)
    follow(steps)
    assert b"".join(steps.out) == b"abcd"
    assert len(steps.notes) == 1 and "resuming where it stopped" in steps.notes[0]


def test_a_quiet_stream_between_two_short_breaks_says_nothing() -> None:
    # The second break is measured from when the stream was open again, not from the
    # first break: a long quiet stretch on a working stream is no interruption.
    reset = errors.Disconnected("GET logs: reset")
    streams = [Stream([b"a", reset]), Stream([None, None, reset]), Stream([b"b", b""])]

    def answer(step: object) -> Any:
        return streams.pop(0) if isinstance(step, calls.Open) else view("running")

    steps = Steps(answer)
    follow(steps)
    assert b"".join(steps.out) == b"ab"
    assert steps.now >= 2 * waits.FOLLOW_IDLE
    assert steps.notes == []


def test_a_silent_follow_asks_after_the_job_and_stays_open_on_the_same_controller() -> None:
    stream = Stream([b"a", None, None, b"b", b""])
    steps = Steps(lambda step: stream if isinstance(step, calls.Open) else view("running"))
    follow(steps)
    assert b"".join(steps.out) == b"ab"
    assert len(steps.opened()) == 1 and len(steps.requests("GET", "/v1/jobs/j1")) == 2
    assert steps.notes == []  # silence is no error (API-009)


def test_a_follow_whose_job_moved_to_another_controller_is_reopened_there() -> None:
    # A frozen controller: its follow goes silent, the poll is answered elsewhere
    # (the transport moved), so the follow is reopened at its offset there, unsaid.
    frozen = Stream([b"abc", None], base="http://a")
    there = Stream([b"de", b""], base="http://b")
    streams = [frozen, there]

    def reply(step: Any) -> Any:
        if isinstance(step, calls.Open):
            return streams.pop(0)
        steps.where = "http://b"
        return view("running")

    steps = Steps(reply)
    follow(steps)
    assert b"".join(steps.out) == b"abcde" and frozen.closed
    assert [o.query for o in steps.opened()] == [None, {"offset": "3"}]
    assert steps.notes == []


def test_a_silent_follow_of_an_ended_job_is_reopened_to_read_the_rest() -> None:
    streams = [Stream([b"a", None]), Stream([b"b", b""])]
    steps = Steps(lambda s: streams.pop(0) if isinstance(s, calls.Open) else view("failed"))
    follow(steps)
    assert b"".join(steps.out) == b"ab"


def test_a_refused_follow_is_raised_at_once() -> None:
    steps = Steps(lambda step: errors.api_error("logs_not_stored", "attached", 400))
    with pytest.raises(errors.LogsNotStored):
        follow(steps)
    assert len(steps.opened()) == 1


def test_a_follow_waits_out_an_outage_then_says_it_lost_contact() -> None:
    # A database outage: the controller answers 500 store_error (API-090).
    steps = Steps(lambda step: errors.api_error("store_error", "database unavailable", 500))
    with pytest.raises(waits.LostContact, match="for 1m0s"):
        follow(steps, quiet=60.0)
    assert steps.now == pytest.approx(60.0, abs=0.6)
    assert len(steps.notes) == 1


def test_a_follow_lives_through_an_outage_shorter_than_its_bound() -> None:
    answers: list[Any] = [errors.api_error("store_error", "down", 500)] * 20
    answers.append(Stream([b"after\n", b""]))
    steps = Steps(lambda step: answers.pop(0))
    follow(steps, quiet=60.0)
    assert steps.out == [b"after\n"]
