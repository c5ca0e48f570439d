"""The polling waits' and the output follow's rules, without a connection (CLI-077..079,
CLI-190..192, EXT-CLI-5)."""

from __future__ import annotations

import pytest

from resource_controller import errors
from resource_controller.client import waits
from resource_controller.client.messages import PolledJob


def view(state: str) -> PolledJob:
    return PolledJob({"id": "j1", "state": state}, 0, [])


def test_until_scheduled_ends_when_the_job_leaves_the_queue() -> None:
    wait = waits.UntilScheduled("j1", None)
    assert wait.timeout(0.0) == waits.SCHEDULED_POLL_TIMEOUT  # CLI-191
    assert not wait.reached(view("queued"))
    assert wait.reached(view("running"))
    assert wait.reached(view("killed"))  # terminal without starting: the caller checks
    assert wait.pause(0.0) == waits.POLL_INTERVAL  # CLI-190


def test_a_deadline_bounds_each_poll_and_each_pause_then_ends_the_wait() -> None:
    wait = waits.UntilScheduled("j1", 10.0)
    assert wait.timeout(9.7) == pytest.approx(0.3)
    assert wait.pause(9.8) == pytest.approx(0.2)
    assert wait.pause(11.0) == 0.0
    with pytest.raises(waits.WaitTimeout, match="deadline exceeded"):
        wait.timeout(10.0)


def test_consecutive_failures_give_up_and_a_good_poll_resets_the_count() -> None:
    wait = waits.UntilScheduled("j1", None)
    down = errors.TransportError("refused")
    for _ in range(waits.SCHEDULED_GIVE_UP - 1):
        wait.failed(down)
    wait.reached(view("queued"))
    for _ in range(waits.SCHEDULED_GIVE_UP - 1):
        wait.failed(down)
    with pytest.raises(waits.PollGiveUp, match="after 17 consecutive failures"):
        wait.failed(down)


def test_until_terminal_names_the_bound_and_the_last_known_state() -> None:
    wait = waits.UntilTerminal("j1", 300.0, now=100.0)
    assert wait.timeout(100.0) == waits.TERMINAL_POLL_TIMEOUT  # CLI-192
    assert not wait.reached(view("running"))
    assert wait.reached(view("succeeded"))
    with pytest.raises(waits.WaitTimeout) as got:
        wait.timeout(400.0)
    assert str(got.value) == "job j1 did not finish within 5m0s (last known state: succeeded)"


def test_until_terminal_gives_up_after_six_failed_polls() -> None:
    wait = waits.UntilTerminal("j1", None, now=0.0)
    wait.reached(view("running"))
    for _ in range(waits.TERMINAL_GIVE_UP - 1):
        wait.failed(errors.TransportError("reset"))
    with pytest.raises(waits.PollGiveUp, match="last known state: running; last error: reset"):
        wait.failed(errors.TransportError("reset"))


@pytest.mark.parametrize(
    ("seconds", "text"), [(5, "5s"), (0.5, "0.5s"), (300, "5m0s"), (3725, "1h2m5s")]
)
def test_bounds_in_messages(seconds: float, text: str) -> None:
    assert waits.seconds_text(seconds) == text


def test_a_followed_stream_reopens_where_it_broke_until_breaks_in_a_row_give_up() -> None:
    resume = waits.StreamResume()
    assert resume.offset == 0 and resume.pause == waits.POLL_INTERVAL
    resume.delivered(b"abc")
    assert not resume.broke()
    resume.delivered(b"de")  # a chunk after a break starts the count over
    assert resume.offset == 5
    assert [resume.broke() for _ in range(waits.STREAM_GIVE_UP)][-2:] == [False, True]
    assert resume.offset == 5


def test_a_follow_without_reconnect_ends_at_its_first_break() -> None:
    assert waits.StreamResume(reconnect=False).broke()


def test_the_logs_and_usage_queries_send_only_what_differs_from_the_defaults() -> None:
    from resource_controller.client import messages

    assert messages.logs_query() is None
    assert messages.logs_query(follow=False, offset=7) == {"follow": "false", "offset": "7"}
    assert messages.UsageAsk().query == {}
    assert messages.UsageAsk("7d", "device", 5).query == {
        "since": "7d",
        "by": "device",
        "limit": "5",
    }
    assert messages.UsageAsk.read({"by": "host", "groups": None})["groups"] == []
