"""``rc run --array``'s pure parts (EXT-ARRAY-2): the status line, the exit code and the
summary, the index prefix over partial lines, when the status is printed, and the flags."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest

from resource_controller.cli import arrayout, arrayrun, basics
from resource_controller.cli import run as run_cli
from resource_controller.client import calls


def task(
    index: int, state: str, exit_code: int | None = None, device: str = "b:0"
) -> dict[str, Any]:
    return {"id": f"t{index}", "index": index, "state": state, "exit_code": exit_code,
            "device_id": device}  # fmt: skip


@pytest.mark.parametrize(
    ("counts", "size", "line"),
    [
        ({"succeeded": 11, "failed": 1, "running": 8, "queued": 80}, 100,
         "12/100 done · 8 running · 80 queued · 1 failed"),
        ({"queued": 6}, 6, "0/6 done · 6 queued"),
        ({"succeeded": 6}, 6, "6/6 done"),
        ({"assigned": 1, "running": 1, "killed": 2, "lost": 1}, 4,
         "3/4 done · 2 running · 2 killed · 1 lost"),
        ({}, 3, "0/3 done"),
    ],
)  # fmt: skip
def test_the_status_line_shows_done_then_only_the_non_zero_parts(
    counts: dict[str, int], size: int, line: str
) -> None:
    assert arrayrun.status_text(counts, size) == line


def test_counts_of_tasks_match_the_views_counts() -> None:
    tasks = [task(0, "queued"), task(1, "running"), task(2, "running")]
    assert arrayrun.counts_of(tasks) == {"queued": 1, "running": 2}


@pytest.mark.parametrize(
    ("tasks", "code"),
    [
        ([task(0, "succeeded", 0), task(1, "succeeded", 0)], 0),
        ([task(2, "failed", 2), task(1, "failed", 7), task(0, "succeeded", 0)], 7),
        ([task(0, "killed"), task(1, "failed", 3)], 1),  # killed without a code
        ([task(0, "lost"), task(1, "failed", 3)], 1),
        ([task(0, "failed", 256)], 1),  # a multiple of 256 must not read as success
        ([task(0, "failed", 257)], 1),
        ([task(0, "failed", 300)], 44),
        ([task(0, "killed", 137)], 137),
    ],
)
def test_the_exit_code_is_the_lowest_failed_index_s(tasks: list[dict[str, Any]], code: int) -> None:
    assert arrayrun.exit_code(tasks) == code
    assert arrayrun.exit_code([]) == 0
    assert calls.exit_status(512) == 1


def test_the_summary_names_each_failed_index_and_why() -> None:
    tasks = [task(i, "succeeded", 0) for i in range(100)]
    tasks[3], tasks[17], tasks[42] = task(3, "failed", 1), task(17, "failed", 2), task(42, "killed")
    assert arrayrun.summary("A", tasks) == (
        "array A: 97/100 succeeded; failed: 3 (exit 1), 17 (exit 2), 42 (killed)"
    )


def test_the_summary_counts_what_it_does_not_name() -> None:
    tasks = [task(i, "failed", 1) for i in range(25)]
    text = arrayrun.summary("A", tasks)
    assert text.startswith("array A: 0/25 succeeded; failed: 0 (exit 1), 1 (exit 1)")
    assert text.endswith("19 (exit 1) and 5 more")


def test_lines_are_prefixed_whole_and_a_partial_one_waits_for_its_end() -> None:
    p = arrayout.Prefixer(7)
    assert p.feed(b"ab") == b""
    assert p.feed(b"c\nde") == b"[7] abc\n"
    assert p.feed(b"f\n\ng\nh") == b"[7] def\n[7] \n[7] g\n"
    assert p.feed(b"") == b""
    assert p.end() == b"[7] h\n"
    assert p.end() == b""
    assert p.feed(b"\n") == b"[7] \n"


def test_output_of_two_tasks_never_shares_a_line() -> None:
    out: list[bytes] = []
    screen = arrayout.Screen(tty=False, out=out.append, err=io.StringIO())
    a, b = arrayout.Lines(0, screen), arrayout.Lines(1, screen)
    a.write(b"x")
    b.write(b"y\n")
    a.write(b"z\n")
    b.write(b"tail")
    a.close()
    b.close()
    assert b"".join(out) == b"[1] y\n[0] xz\n[1] tail\n"


def test_once_stdout_fails_the_rest_of_the_output_is_dropped() -> None:
    def out(_data: bytes) -> None:
        raise BrokenPipeError("closed")

    screen = arrayout.Screen(tty=False, out=out, err=io.StringIO())
    with pytest.raises(BrokenPipeError):
        screen.output(b"[0] a\n")
    screen.output(b"[1] b\n")  # said once, by the follower that met it
    assert screen.broken


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_off_a_terminal_the_status_is_printed_when_it_changes_at_most_every_5s() -> None:
    err, clock = io.StringIO(), Clock()
    screen = arrayout.Screen(tty=False, out=lambda _b: None, err=err, now=clock)
    screen.status("0/2 done · 2 queued")
    screen.status("0/2 done · 2 queued")
    clock.t = 1
    screen.status("0/2 done · 2 running")  # changed, but too soon
    clock.t = 5
    screen.status("0/2 done · 2 running")
    clock.t = 6
    screen.status("1/2 done · 1 running")
    screen.status("2/2 done", final=True)  # the last one is always said
    assert err.getvalue().splitlines() == [
        "rc: 0/2 done · 2 queued",
        "rc: 0/2 done · 2 running",
        "rc: 2/2 done",
    ]


def test_on_a_terminal_the_status_line_is_redrawn_in_place_and_cleared_for_output() -> None:
    err = io.StringIO()
    out: list[bytes] = []
    screen = arrayout.Screen(tty=True, out=out.append, err=err)
    screen.status("0/1 done · 1 running")
    screen.output(b"[0] hi\n")
    screen.say("note")
    screen.status("1/1 done", final=True)
    assert out == [b"[0] hi\n"]
    assert err.getvalue() == (
        "\r0/1 done · 1 running\x1b[K"
        "\r\x1b[K\r0/1 done · 1 running\x1b[K"
        "\r\x1b[Krc: note\n\r0/1 done · 1 running\x1b[K"
        "\r1/1 done\x1b[K\n"
    )


def test_after_the_last_status_line_nothing_redraws_it() -> None:
    err = io.StringIO()
    screen = arrayout.Screen(tty=True, out=lambda _b: None, err=err)
    screen.status("1/2 done · 1 running", final=True)
    screen.say("detached")
    assert err.getvalue() == "\r1/2 done · 1 running\x1b[K\nrc: detached\n"


def test_a_stopped_follow_ends_at_its_next_step_and_long_reads_come_in_slices() -> None:
    stop = threading.Event()
    seen: list[Any] = []

    def follow() -> Any:
        chunk = yield calls.Read("s", 2.0)
        seen.append(chunk)
        chunk = yield calls.Read("s", 2.0)
        seen.append(chunk)
        yield calls.Sleep(0)
        seen.append("never")

    op = arrayrun.stoppable(follow(), stop)
    step = next(op)
    assert step == calls.Read("s", arrayrun.READ_SLICE)
    for _ in range(3):
        assert op.send(None) == calls.Read("s", arrayrun.READ_SLICE)
    assert op.send(None) == calls.Read("s", arrayrun.READ_SLICE)  # the follow's own next read
    assert seen == [None]
    assert op.send(b"data") == calls.Sleep(0)
    stop.set()
    with pytest.raises(StopIteration):
        op.send(None)
    assert seen == [None, b"data"]


def test_an_error_of_a_step_goes_to_the_follow() -> None:
    caught: list[Exception] = []

    def follow() -> Any:
        try:
            yield calls.Sleep(0)
        except OSError as e:
            caught.append(e)

    op = arrayrun.stoppable(follow(), threading.Event())
    next(op)
    with pytest.raises(StopIteration):
        op.throw(OSError("x"))
    assert len(caught) == 1


def test_only_a_placed_task_is_followed_and_as_many_as_run() -> None:
    assert arrayrun.started(task(0, "running"))
    assert arrayrun.started(task(0, "failed", 1))
    assert not arrayrun.started(task(0, "killed", device=""))  # killed while queued
    assert not arrayrun.started(task(0, "queued", device=""))
    many = [task(i, "running") for i in range(100)]
    assert arrayrun.follow_limit(many[:2], 0) == arrayrun.FOLLOW_MIN
    assert arrayrun.follow_limit(many[:10], 0) == 10
    assert arrayrun.follow_limit(many[:2], 8) == 8
    assert arrayrun.follow_limit(many, 0) == arrayrun.FOLLOW_MAX


def _values(*argv: str) -> dict[str, Any]:
    return run_cli.parse([*argv, "--", "true"])[0]


def test_the_array_flags_parse() -> None:
    values = _values("--array", "0-9%2", "--output-dir=d", "--detach", "-ojson")
    assert (values["array"], values["output_dir"], values["detach"], values["output"]) == (
        "0-9%2",
        "d",
        True,
        "json",
    )
    assert run_cli.build(values, ["true"]).array == "0-9%2"
    arrayrun.check(values)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--detach"], "--detach needs --array"),
        (["--output-dir", "d"], "--output-dir needs --array"),
        (["-o", "json"], "-o/--output needs --array"),
        (["--array", "0-3", "-o", "yaml"], "-o/--output: 'yaml' is not one of text, json"),
        (["--array", "0-3", "--timeout", "1m"], "--timeout cannot be used with --array"),
    ],
)
def test_the_array_only_flags_are_refused_without_it(argv: list[str], words: str) -> None:
    with pytest.raises(basics.Failure, match=words):
        arrayrun.check(_values(*argv))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--array", "5-1"], "--array '5-1'"),
        (["--array", "0-20000"], "--array '0-20000'"),
        (["--array", "0-3", "--no-wait"], "--array and --no-wait"),
        (["--array", "0-3", "-i"], "--array cannot be used with a terminal or stdin"),
    ],
)
def test_a_bad_array_is_refused_before_any_request(argv: list[str], words: str) -> None:
    with pytest.raises(basics.Failure, match=words):
        run_cli.build(_values(*argv), ["true"])
