"""The pure verdicts of ``core.expiry``: silence, deadlines, the stall guard, the flap guard."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resource_controller.core import expiry
from resource_controller.core.expiry import Demotion, Proof, StallGuard, SweepRules

NOW = 1_800_000_000
RULES = SweepRules()


# ---- judging (STORE-100) ----------------------------------------------------------------


def test_production_numbers() -> None:
    # store.md §23 / SRV-031 / SRV-032.
    assert (expiry.GRACE, expiry.UNHEALTHY_AFTER) == (30, 300)
    assert (expiry.SWEEP_INTERVAL, expiry.HOLD_OFF) == (10, 30)
    assert (expiry.FLAP_LIMIT, expiry.FLAP_WINDOW) == (3, 3600)
    assert SweepRules() == SweepRules(30, 300, None, False, False)


def test_judging_starts_exactly_at_the_hold_off() -> None:
    rules = SweepRules(hold_off_until=NOW)
    assert not rules.judging(NOW - 1)
    assert rules.judging(NOW)  # now >= hold-off
    assert rules.judging(NOW + 1)


def test_an_unset_hold_off_always_judges() -> None:
    assert SweepRules(hold_off_until=None).judging(0)


def test_a_stalled_pass_never_judges() -> None:
    assert not SweepRules(stalled=True).judging(NOW)
    assert not SweepRules(hold_off_until=NOW - 100, stalled=True).judging(NOW)


# ---- demotion by silence (STORE-101) -----------------------------------------------------


@pytest.mark.parametrize(
    ("state", "quiet", "judging", "verdict"),
    [
        ("ready", 0, True, Demotion.NONE),
        ("ready", 29, True, Demotion.NONE),
        ("ready", 30, True, Demotion.UNKNOWN),  # at exactly the grace
        ("busy", 30, True, Demotion.UNKNOWN),
        ("unknown", 30, True, Demotion.NONE),  # already unknown: nothing to report
        ("unhealthy", 30, True, Demotion.NONE),  # quarantine outranks unknown
        ("ready", 299, True, Demotion.UNKNOWN),
        ("ready", 300, True, Demotion.WRITE_OFF),  # at exactly unhealthy-after
        ("busy", 300, True, Demotion.WRITE_OFF),
        ("unknown", 300, True, Demotion.WRITE_OFF),
        ("unhealthy", 300, True, Demotion.REAP_ONLY),  # keeps its reason, still reaped
        ("unhealthy", 10_000, True, Demotion.REAP_ONLY),
        # Inside the hold-off (or on a stalled pass): unknown at most, never a write-off.
        ("ready", 10_000, False, Demotion.UNKNOWN),
        ("busy", 10_000, False, Demotion.UNKNOWN),
        ("unknown", 10_000, False, Demotion.NONE),
        ("unhealthy", 10_000, False, Demotion.NONE),
    ],
)
def test_demotion(state: str, quiet: int, judging: bool, verdict: Demotion) -> None:
    assert expiry.demotion(state, NOW - quiet, NOW, RULES, judging) is verdict


def test_no_verdict_readies_anything() -> None:
    # STORE-183 at the level of verdicts: there is no "make ready" among them.
    assert {d.value for d in Demotion} == {"none", "unknown", "write_off", "reap_only"}


def test_demotion_follows_the_rules_given() -> None:
    short = SweepRules(grace=2, unhealthy_after=4)
    assert expiry.demotion("ready", NOW - 2, NOW, short, True) is Demotion.UNKNOWN
    assert expiry.demotion("ready", NOW - 4, NOW, short, True) is Demotion.WRITE_OFF


def test_a_heartbeat_from_the_future_is_not_silence() -> None:
    # A clock stepped backwards makes silence negative: nothing happens.
    assert expiry.demotion("busy", NOW + 60, NOW, RULES, True) is Demotion.NONE


# ---- leases (STORE-053, STORE-103, STORE-105) ---------------------------------------------


def test_a_lease_is_expired_at_exactly_its_deadline() -> None:
    assert not expiry.lease_expired(NOW + 1, NOW)
    assert expiry.lease_expired(NOW, NOW)
    assert expiry.lease_expired(NOW - 1, NOW)


@pytest.mark.parametrize(
    ("kind", "retain", "judging", "expires"),
    [
        ("job", False, True, True),
        ("hold", False, True, True),
        ("job", True, True, False),  # retention: job leases never expire
        ("hold", True, True, True),  # holds keep their TTL
        ("job", False, False, False),  # not judging: nothing expires
        ("hold", True, False, False),
    ],
)
def test_lease_expires(kind: str, retain: bool, judging: bool, expires: bool) -> None:
    rules = SweepRules(retain=retain)
    assert expiry.lease_expires(NOW, kind, NOW, rules, judging) is expires
    assert not expiry.lease_expires(NOW + 1, kind, NOW, rules, judging)


# ---- the stall guard ------------------------------------------------------------------------


def test_stalled_is_more_than_three_intervals() -> None:
    assert not expiry.stalled(None, NOW, 10)  # nothing to compare the first pass with
    assert not expiry.stalled(NOW - 10, NOW, 10)
    assert not expiry.stalled(NOW - 30, NOW, 10)  # exactly three intervals: still on time
    assert expiry.stalled(NOW - 30.5, NOW, 10)
    assert expiry.stalled(NOW - 600, NOW, 10)
    assert not expiry.stalled(NOW + 600, NOW, 10)  # a clock stepped back is not a stall
    assert expiry.stalled(NOW - 1, NOW, 0.2)  # scales with the interval


def test_the_guard_starts_caught_up() -> None:
    guard = StallGuard()
    assert guard.may_judge and not guard.just_stalled
    guard = guard.after_pass(NOW, 10)
    assert guard.may_judge and guard.previous == NOW


def test_a_stall_suspends_judging_for_three_on_schedule_passes() -> None:
    guard = StallGuard(previous=NOW)
    at = NOW + 10
    guard = guard.after_pass(at, 10)
    assert guard.may_judge
    at += 400  # the controller was paused
    guard = guard.after_pass(at, 10)
    assert guard.just_stalled and not guard.may_judge
    verdicts = []
    for _ in range(4):
        at += 10
        guard = guard.after_pass(at, 10)
        verdicts.append(guard.may_judge)
    # The stalled pass and the two after it do not judge; the third on-schedule one does:
    # 30 s after the stall at 10 s intervals, the same window the start-up hold-off gives.
    assert verdicts == [False, False, True, True]
    assert not guard.just_stalled


def test_a_second_stall_starts_the_count_again() -> None:
    guard = StallGuard(previous=NOW).after_pass(NOW + 100, 10)
    guard = guard.after_pass(NOW + 110, 10).after_pass(NOW + 120, 10)
    assert guard.steady == 2
    guard = guard.after_pass(NOW + 200, 10)
    assert guard.just_stalled and not guard.may_judge


def test_a_stalled_pass_still_demotes_to_unknown() -> None:
    # The guard vetoes judging only; unknown hands nothing out and a heartbeat undoes it.
    rules = SweepRules(stalled=True)
    judging = rules.judging(NOW)
    assert expiry.demotion("busy", NOW - 900, NOW, rules, judging) is Demotion.UNKNOWN
    assert not expiry.lease_expires(NOW - 900, "job", NOW, rules, judging)


# ---- recovery proofs (STORE-120) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("proof", "clean", "summary"),
    [
        (Proof(), False, ""),
        (Proof(isolated=True), True, "worker restarted in an isolated PID namespace"),
        (Proof(isolated=True, survivors_found=True), True, "worker restarted in an isolated"),
        (
            Proof(survivors_checked=True),
            True,
            "worker found no surviving processes from its previous run",
        ),
        (Proof(survivors_checked=True, survivors_found=True), False, ""),
        (Proof(survivors_found=True), False, ""),
    ],
)
def test_proofs(proof: Proof, clean: bool, summary: str) -> None:
    assert proof.proves_clean is clean
    assert proof.summary.startswith(summary) and bool(proof.summary) is clean


# ---- the flap guard (STORE-122/123) -------------------------------------------------------


def test_the_flap_window_includes_a_recovery_exactly_one_hour_old() -> None:
    assert expiry.flap_cutoff(NOW) == NOW - 3600


def test_three_recoveries_per_window() -> None:
    assert [expiry.flap_allows(n) for n in range(5)] == [True, True, True, False, False]
    assert [expiry.flap_remaining(n) for n in range(5)] == [3, 2, 1, 0, 0]


# ---- what a sweep may leave unread --------------------------------------------------------


@given(
    state=st.sampled_from(["ready", "busy", "unknown", "unhealthy"]),
    quiet=st.integers(-5, 400),
    grace=st.floats(0.1, 400, allow_nan=False),
    unhealthy_after=st.floats(0.1, 400, allow_nan=False),
    judging=st.booleans(),
)
def test_no_verdict_below_the_quiet_floor(
    state: str, quiet: int, grace: float, unhealthy_after: float, judging: bool
) -> None:
    # The sweep reads only devices heard at or before now - floor + 1 (store/sweep.py).
    rules = SweepRules(grace=grace, unhealthy_after=unhealthy_after)
    heard = NOW - quiet
    if expiry.demotion(state, heard, NOW, rules, judging) is not Demotion.NONE:
        assert heard <= NOW - expiry.quiet_floor(rules, judging) + 1
        assert quiet >= expiry.quiet_floor(rules, judging)
