"""Priority aging (EXT-FAIR-1): a pure rule with the clock passed in."""

from __future__ import annotations

from resource_controller.core import passloop
from resource_controller.core.scheduling import (
    PRIORITY_MAX,
    DeviceSnap,
    JobSnap,
    aged_queue_key,
    effective_priority,
    queue_key,
    queue_position,
)

T0 = 1_000_000


def test_one_step_per_whole_duration_waited() -> None:
    assert effective_priority(-10, T0, T0, 60) == -10
    assert effective_priority(-10, T0, T0 + 59, 60) == -10
    assert effective_priority(-10, T0, T0 + 60, 60) == -9
    assert effective_priority(-10, T0, T0 + 600, 60) == 0


def test_capped_at_the_top_and_never_lowered() -> None:
    assert effective_priority(0, T0, T0 + 10**6, 60) == PRIORITY_MAX
    assert effective_priority(10, T0, T0 + 10**6, 60) == 10
    assert effective_priority(42, T0, T0 + 10**6, 60) == 42  # a stored out-of-range value


def test_off_and_a_clock_behind_age_nothing() -> None:
    assert effective_priority(-3, T0, T0 + 10**6, 0) == -3
    assert effective_priority(-3, T0, T0 - 500, 60) == -3
    assert aged_queue_key(T0, 0) is queue_key


def test_the_aged_order_lets_an_old_low_job_ahead_of_new_high_ones() -> None:
    old_low = JobSnap("low", seq=1, priority=-5, queued_at=T0)
    fresh_high = JobSnap("high", seq=2, priority=5, queued_at=T0 + 600)
    now = T0 + 600
    assert sorted([old_low, fresh_high], key=queue_key)[0].id == "high"
    # 600 s at one step per 60 s: -5 + 10 = 5 == 5, and it queued first.
    key = aged_queue_key(now, 60)
    assert sorted([fresh_high, old_low], key=key)[0].id == "low"
    assert queue_position(old_low, [old_low, fresh_high], key) == 1
    assert queue_position(fresh_high, [old_low, fresh_high], key) == 2


def test_a_pass_with_aging_places_the_aged_job_first() -> None:
    devices = [DeviceSnap("box:gpu0")]
    jobs = [
        JobSnap("low", seq=1, priority=-1, queued_at=T0),
        JobSnap("high", seq=2, priority=1, queued_at=T0 + 100),
    ]
    assert passloop.plan(jobs, devices).assignments == {"high": ("box:gpu0",)}
    aged = passloop.plan(jobs, devices, aged_queue_key(T0 + 100, 50))
    assert aged.assignments == {"low": ("box:gpu0",)}
