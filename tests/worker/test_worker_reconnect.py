"""Reconnection: when the worker registers again (WRK-032, WRK-150..155).

The tracker's rules with plain numbers and seeded randomness; then the agent against
the fake controller on a fake clock, which moves only when a test says so.
"""

from __future__ import annotations

import logging
import random

import pytest
from fake_controller import FakeController, Reply, Running, job, until
from worker_helpers import run

from resource_controller.clock import FakeClock
from resource_controller.worker import reconnect
from resource_controller.worker.timings import DEFAULT

SEED = 7


def jitter(seed: int = SEED, draw: int = 1) -> float:
    """The delay the tracker's ``draw``-th arming picks with ``Random(seed)``."""
    rng = random.Random(seed)
    for _ in range(draw - 1):
        rng.random()
    return rng.random() * DEFAULT.reregister_jitter


def tracker() -> reconnect.Reconnect:
    return reconnect.Reconnect(random.Random(SEED))


def test_first_contact_arms_nothing() -> None:  # WRK-151
    t = tracker()
    t.observe(1000.0, "instance-a")
    assert not t.owed and (t.last_at, t.instance) == (1000.0, "instance-a")


def test_silence_of_five_minutes_arms() -> None:  # WRK-151, WRK-152
    t = tracker()
    t.observe(0.0, "a")
    t.observe(299.9, "a")
    assert not t.owed
    t.observe(299.9 + 300.0, "a")  # exactly the threshold counts
    assert t.owed and t.due_at == pytest.approx(599.9 + jitter())
    assert 599.9 <= t.due_at < 599.9 + 30


def test_instance_change_arms() -> None:  # WRK-151
    t = tracker()
    t.observe(0.0, "")  # no name yet
    t.observe(1.0, "a")  # the first name is not a change
    t.observe(2.0, "")  # an empty header never overwrites and is never a change
    assert not t.owed and t.instance == "a"
    t.observe(3.0, "b")
    assert t.owed and t.instance == "b" and t.due_at == pytest.approx(3.0 + jitter())


def test_a_second_reason_does_not_move_the_appointment() -> None:  # WRK-152
    t = tracker()
    t.observe(0.0, "a")
    t.observe(10.0, "b")
    due = t.due_at
    t.observe(11.0, "c")
    t.observe(400.0, "c")
    assert t.due_at == due


def test_time_only_moves_forward() -> None:  # WRK-151: responses finish out of order
    t = tracker()
    t.observe(500.0, "a")
    t.observe(100.0, "a")
    assert t.last_at == 500.0 and not t.owed
    t.observe(799.0, "a")
    assert not t.owed  # measured from 500, not from 100


def test_attempt_and_settlement() -> None:  # WRK-153
    t = tracker()
    t.observe(0.0, "a")
    t.observe(1.0, "b")
    due = t.due_at
    assert due is not None and not t.due(due - 0.001) and t.due(due)
    t.attempting(31.0)
    assert t.due_at == 31.0 + DEFAULT.reregister_retry and not t.due(90.9) and t.due(91.0)
    t.settled()
    assert not t.owed and not t.due(10_000.0)


# ---- the agent ----------------------------------------------------------------


async def polls_after(ctl: FakeController, n: int = 3) -> None:
    """Let ``n`` more polls happen (each idle poll runs the re-registration check)."""
    seen = len(ctl.poll_times)
    await until(lambda: len(ctl.poll_times) >= seen + n)


def test_instance_change_reregisters_once_due(caplog: pytest.LogCaptureFixture) -> None:
    # WRK-150, WRK-152
    ctl = FakeController()
    clock = FakeClock()

    async def go() -> None:
        r = await Running(ctl, clock=clock, rng=random.Random(SEED)).started()
        ctl.instance = "instance-b"  # the controller restarted
        await until(lambda: r.agent.contact.owed)
        await polls_after(ctl)
        assert len(ctl.registrations) == 1  # not due yet: time has not moved
        clock.advance(jitter())
        await until(lambda: len(ctl.registrations) == 2)
        await polls_after(ctl)
        assert not r.agent.contact.owed and len(ctl.registrations) == 2
        await r.finish()

    with caplog.at_level(logging.INFO, logger="resource_controller.worker"):
        run(go())
    first, second = ctl.registrations
    assert second["devices"] == first["devices"] and second["host"] == "box"
    assert "controller instance changed from instance-a to instance-b" in caplog.text


def test_silence_reregisters() -> None:  # WRK-151: ≥ 5 minutes without contact
    ctl = FakeController()
    clock = FakeClock()

    async def go() -> None:
        r = await Running(ctl, clock=clock, rng=random.Random(SEED)).started()
        await polls_after(ctl)
        clock.advance(DEFAULT.reregister_after)  # the next answer comes "5 min later"
        await until(lambda: r.agent.contact.owed)
        clock.advance(30)
        await until(lambda: len(ctl.registrations) == 2)
        await r.finish()

    run(go())


def test_never_while_a_job_is_supervised() -> None:  # WRK-150
    ctl = FakeController()
    clock = FakeClock()
    a = job(["sleep", "1"])
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl, clock=clock, rng=random.Random(SEED)).started()
        await until(lambda: bool(r.agent.supervised_job_ids))
        ctl.instance = "instance-b"
        await until(lambda: r.agent.contact.owed)
        clock.advance(3600)
        await polls_after(ctl, 5)
        assert r.agent.supervised_job_ids and len(ctl.registrations) == 1
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await until(lambda: len(ctl.registrations) == 2)
        await r.finish()

    run(go())
    # The job ended and its outcome landed before the registration that reaps.
    assert ctl.event_index("status", a["job_id"])[-1] < ctl.event_index("register")[-1]


def test_failure_is_retried_a_minute_later(caplog: pytest.LogCaptureFixture) -> None:  # WRK-153
    ctl = FakeController()
    clock = FakeClock()

    async def go() -> None:
        r = await Running(ctl, clock=clock, rng=random.Random(SEED)).started()
        ctl.register_status = 503
        ctl.instance = "instance-b"
        await until(lambda: r.agent.contact.owed)
        clock.advance(30)
        await until(lambda: len(ctl.registrations) == 2)
        attempted_at = clock.monotonic()
        assert r.agent.contact.due_at == attempted_at + DEFAULT.reregister_retry
        clock.advance(DEFAULT.reregister_retry - 1)
        await polls_after(ctl)
        assert len(ctl.registrations) == 2
        ctl.register_status = 200
        clock.advance(1)
        await until(lambda: len(ctl.registrations) == 3)
        await polls_after(ctl)
        assert not r.agent.contact.owed and len(ctl.registrations) == 3
        await r.finish()

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.agent"):
        run(go())
    assert "re-registration failed: register: controller returned 503" in caplog.text


def test_checked_only_after_a_successful_idle_poll() -> None:  # WRK-150, WRK-062
    ctl = FakeController()
    clock = FakeClock()

    async def go() -> None:
        r = await Running(ctl, clock=clock, rng=random.Random(SEED)).started()
        ctl.instance = "instance-b"
        await until(lambda: r.agent.contact.owed)
        ctl.answers = [Reply(500) for _ in range(5)]
        await until(lambda: len(ctl.answers) < 5)  # polls are failing from here on
        clock.advance(60)
        await until(lambda: len(ctl.registrations) == 2)
        await r.finish()

    run(go())
    # Due during five failed polls, yet registered only after the next good one.
    polls = [(i, status) for i, (kind, _, status) in enumerate(ctl.events) if kind == "poll"]
    register = ctl.event_index("register")[-1]
    last_error = max(i for i, status in polls if status == 500)
    assert last_error < register
    assert any(last_error < i < register and status == 204 for i, status in polls)
