"""The history checker on hand-made histories, and the flock recorder on real processes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from support.history import (
    REFUSED_EXIT,
    FlockRecorder,
    History,
    Interval,
    Observation,
    Submission,
    add_controller_jobs,
    check,
    duplicates,
    left_terminal_state,
    outside_lease,
    overlaps,
    parse_records,
    several_terminal_states,
    without_terminal_state,
)


def iv(
    job: str, start: float, end: float | None, device: str = "h:gpu0", src: str = "flock"
) -> Interval:
    return Interval(device, job, start, end, src)


def test_overlap_on_one_device_is_found() -> None:
    a, b = iv("a", 0, 10), iv("b", 9.5, 12)
    assert overlaps([b, a]) == [(a, b)]


def test_touching_intervals_are_allowed() -> None:
    assert overlaps([iv("a", 0, 10), iv("b", 10, 12), iv("c", 12, 12), iv("d", 12, 20)]) == []


def test_whole_second_records_that_may_touch_are_not_an_overlap() -> None:
    # Began and ended within second 5, then the other began in it: both read [5, ...].
    a = iv("a", 5, 6, src="controller")
    b = iv("b", 5, 5, src="controller")
    assert overlaps([a, b]) == []
    assert overlaps([b, a]) == []
    # Both lasting past the shared second is an overlap whatever the order.
    c = iv("c", 5, 7, src="controller")
    assert overlaps([a, c]) == [(a, c)]


def test_intervals_on_different_devices_or_sources_never_conflict() -> None:
    assert overlaps([iv("a", 0, 10), iv("b", 5, 12, device="h:gpu1")]) == []
    assert overlaps([iv("a", 0, 10), iv("b", 5, 12, src="controller")]) == []


def test_an_interval_inside_another_is_found_and_so_is_every_pair() -> None:
    a, b, c = iv("a", 0, 100), iv("b", 10, 20), iv("c", 30, 40)
    assert overlaps([a, b, c]) == [(a, b), (a, c)]


def test_an_unfinished_flock_hold_ends_at_the_next_start() -> None:
    # The next start took the lock with flock -n, so the killed holder had let go.
    assert overlaps([iv("a", 0, None), iv("b", 50, 60)]) == []


def test_an_unfinished_controller_hold_lasts_for_ever() -> None:
    a, b = iv("a", 0, None, src="controller"), iv("b", 50, 60, src="controller")
    assert overlaps([a, b]) == [(a, b)]


def test_missing_terminal_state_is_found() -> None:
    h = History(
        submitted=[Submission("k1", "j1"), Submission("k2", "j2")],
        observations=[Observation("j1", "running", 1), Observation("j1", "succeeded", 2)],
    )
    h.observations.append(Observation("j2", "running", 3))
    assert without_terminal_state(h) == ["j2"]
    assert not check(h).ok


def test_two_terminal_states_and_leaving_one_are_found() -> None:
    h = History(
        submitted=[Submission("", "j1"), Submission("", "j2")],
        observations=[
            Observation("j1", "succeeded", 1),
            Observation("j1", "lost", 2),
            Observation("j2", "failed", 1),
            Observation("j2", "running", 5),
        ],
    )
    assert several_terminal_states(h) == {"j1": ["lost", "succeeded"]}
    assert left_terminal_state(h) == ["j2"]


def test_duplicate_jobs_for_one_key_are_found() -> None:
    h = History(
        submitted=[Submission("k1", "j1"), Submission("k1", "j1"), Submission("k2", "j2")],
        stored=[("j1", "k1"), ("j2", "k2"), ("j3", "k2"), ("j4", "")],
    )
    assert duplicates(h) == {"k2": ["j2", "j3"]}
    assert check(h).figures()["duplicate_jobs"] == 1


def test_a_clean_history_passes() -> None:
    h = History(
        submitted=[Submission("k1", "j1"), Submission("k2", "j2")],
        observations=[Observation("j1", "succeeded", 1), Observation("j2", "lost", 2)],
        intervals=[iv("j1", 0, 1), iv("j2", 1, None)],
        stored=[("j1", "k1"), ("j2", "k2")],
    )
    verdict = check(h)
    assert verdict.ok, verdict
    assert verdict.figures()["unfinished_intervals"] == 1


def test_a_hold_outside_its_lease_is_found() -> None:
    ctl = [iv("a", 100, 110, src="controller"), iv("b", 110, 120, src="controller")]
    inside, late, early = iv("a", 100.2, 110.5), iv("b", 111, 125), iv("c", 5, 6)
    assert outside_lease([*ctl, inside, late, early]) == [late, early]
    h = History(intervals=[*ctl, late])
    assert check(h).ok
    assert not check(h, leases=True).ok


def test_controller_records_keep_the_latest_read_of_each_job() -> None:
    h = History()
    running = {
        "id": "j1",
        "state": "running",
        "device_id": "h:gpu0",
        "started_at": "2026-12-01T10:00:00Z",
    }
    add_controller_jobs(h, [running], at=1)
    done = {**running, "state": "succeeded", "finished_at": "2026-12-01T10:00:05Z"}
    add_controller_jobs(h, [done], at=2)
    [only] = h.intervals
    assert only.end is not None and only.end - only.start == 5
    assert [o.state for o in h.observations] == ["running", "succeeded"]


def test_malformed_record_lines_are_refused() -> None:
    try:
        parse_records(["start 1.0 dev"])
    except ValueError as exc:
        assert "malformed flock record" in str(exc)
    else:
        raise AssertionError("a short line was accepted")


def _run(cmd: list[str], device: str, job: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=dict(os.environ, RC_DEVICE=device, RC_JOB_ID=job))


def test_the_recorder_stamps_holds_and_catches_a_second_holder(tmp_path: Path) -> None:
    rec = FlockRecorder(tmp_path / "locks")
    first = _run(rec.command("sleep 1", exit_code=3), "h:gpu0", "j1")
    deadline = time.monotonic() + 10
    while not (rec.dir / "h:gpu0.rec").exists():
        assert time.monotonic() < deadline, "the first job never stamped its start"
        time.sleep(0.01)
    second = _run(rec.command("true"), "h:gpu0", "j2")
    other = _run(rec.command("true"), "h:gpu1", "j3")
    assert second.wait(10) == REFUSED_EXIT
    assert other.wait(10) == 0
    assert first.wait(10) == 3
    intervals, refusals = rec.read()
    by_job = {i.job_id: i for i in intervals}
    assert set(by_job) == {"j1", "j3"}
    j1 = by_job["j1"]
    assert j1.end is not None and 0.9 < j1.end - j1.start < 5
    assert [(r.device, r.job_id) for r in refusals] == [("h:gpu0", "j2")]
    assert not check(History(intervals=intervals, refusals=refusals)).ok
