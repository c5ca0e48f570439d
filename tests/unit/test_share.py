"""The pure rules of a fair share (EXT-SHARE-1, EXT-SHARE-2): submitter limits in the
planner, dependencies in a plan, and the words ``waiting_for`` becomes."""

from __future__ import annotations

import pytest

from resource_controller.core import identity, limits, share, states, waiting
from resource_controller.core.identity import Caller
from resource_controller.core.passloop import plan
from resource_controller.core.planner import Planner
from resource_controller.core.scheduling import DeviceSnap, JobSnap
from resource_controller.core.share import SubmitterLimits, over_limit
from resource_controller.core.states import Role

FLEET = [DeviceSnap(f"box:gpu{i}", host="box") for i in range(4)]


def job(n: int, share: str = "alice", **kw: object) -> JobSnap:
    return JobSnap(id=f"j{n}", seq=n, share=share, **kw)  # type: ignore[arg-type]


# ---- EXT-SHARE-1: the limit rule ----------------------------------------------------------


def test_a_name_of_its_own_wins_over_the_default() -> None:
    lim = SubmitterLimits(default=2, names={"alice": 4})
    assert lim.on and lim.of("alice") == 4 and lim.of("bob") == 2
    assert not share.NO_LIMITS.on and share.NO_LIMITS.of("bob") is None
    assert SubmitterLimits(names={"alice": 1}).of("bob") is None  # no default: no limit


@pytest.mark.parametrize(
    ("held", "count", "expected"),
    [(0, 1, None), (1, 1, None), (2, 1, 2), (1, 2, 2), (0, 2, None), (0, 3, 2)],
)
def test_over_limit_counts_what_is_held_and_what_is_asked(
    held: int, count: int, expected: int | None
) -> None:
    # EXT-SHARE-1: every device of a gang counts.
    assert over_limit(SubmitterLimits(default=2), {"alice": held}, "alice", count) == expected


def test_a_limit_of_zero_keeps_every_job_of_that_name() -> None:
    assert over_limit(SubmitterLimits(names={"bot": 0}), {}, "bot", 1) == 0


def test_a_job_over_its_limit_claims_nothing_and_the_next_person_is_placed() -> None:
    """EXT-SHARE-1: no head-of-line blocking across people."""
    lim = SubmitterLimits(default=1)
    out = plan(
        [job(1, "alice"), job(2, "alice"), job(3, "bob", device_id="box:gpu1")],
        FLEET[:2],
        limits=lim,
        held={"alice": 1},
    )
    assert out.limited == {"j1": 1, "j2": 1}
    assert out.assignments == {"j3": ("box:gpu1",)}
    assert out.reservations == {}


def test_what_a_pass_places_counts_toward_the_limit_in_the_same_pass() -> None:
    lim = SubmitterLimits(default=2)
    out = plan([job(i) for i in range(1, 5)], FLEET, limits=lim)
    assert sorted(out.assignments) == ["j1", "j2"] and sorted(out.limited) == ["j3", "j4"]
    # Two devices stay free for someone else: nothing claims them.
    assert out.reservations == {}


def test_a_gang_over_the_limit_waits_while_a_smaller_job_of_the_same_name_runs() -> None:
    lim = SubmitterLimits(default=3)
    out = plan([job(1, count=3), job(2, count=1)], FLEET, limits=lim, held={"alice": 1})
    assert out.limited == {"j1": 3} and list(out.assignments) == ["j2"]


def test_a_pinned_list_counts_each_device() -> None:
    pins = ("box:gpu0", "box:gpu1")
    lim = SubmitterLimits(default=2)
    blocked = plan(
        [job(1, device_id=pins[0], device_ids=pins, count=2)], FLEET, limits=lim, held={"alice": 1}
    )
    assert blocked.limited == {"j1": 2}


def test_the_planner_without_limits_asks_nothing_of_them() -> None:
    p = Planner(FLEET)
    assert not p.limited_on and p.limited("anyone", 99) is None
    offer = p.offer(job(1))
    assert offer.limit is None and offer.choices


def test_placed_counts_toward_held_only_with_limits_on() -> None:
    p = Planner(FLEET, SubmitterLimits(default=2), {"alice": 1})
    p.placed(job(1), ["box:gpu0"])
    assert p.held == {"alice": 2} and p.limited("alice", 1) == 2 and p.limited("bob", 2) is None


# ---- EXT-SHARE-2: dependencies -------------------------------------------------------------


@pytest.mark.parametrize(
    ("ended", "after_any", "met"),
    [
        ("succeeded", False, True),
        ("failed", False, False),
        ("killed", False, False),
        ("lost", False, False),
        ("failed", True, True),
        ("killed", True, True),
    ],
)
def test_only_success_meets_a_dependency_unless_any_end_will_do(
    ended: str, after_any: bool, met: bool
) -> None:
    assert share.dependency_met(ended, after_any) is met


def test_a_job_waiting_for_others_takes_no_part_in_a_plan() -> None:
    out = plan([job(1, after_open=1, device_id="box:gpu0"), job(2, device_id="box:gpu0")], FLEET)
    # The waiting job neither runs nor reserves: the one behind it takes the device.
    assert out.assignments == {"j2": ("box:gpu0",)} and out.reservations == {}


def test_the_kill_reason_names_the_job() -> None:
    assert states.dependency_failed("abc") == "dependency_failed: abc"


def test_at_most_64_jobs_in_after() -> None:
    from resource_controller.client import submit

    assert limits.AFTER.count == 64 == submit.AFTER_MAX


# ---- the name a limit counts under (EXT-SHARE-1 with EXT-WHO) -----------------------------


@pytest.mark.parametrize(
    ("caller", "recorded", "share"),
    [
        (Caller(Role.CLIENT), "alice@box", "alice@box"),
        (Caller(Role.CLIENT, "alice"), "alice@box/s1", "alice"),
        (Caller(Role.CLIENT, "alice"), "alice", "alice"),
        (Caller(Role.ADMIN, "ops"), "bob", "bob"),  # an operator submits for others
    ],
)
def test_the_share_name(caller: Caller, recorded: str, share: str) -> None:
    assert identity.share_name(caller, recorded) == share


# ---- waiting_for (EXT-WHY-1a with EXT-SHARE) ------------------------------------------------


def _snap(queued: list[JobSnap], **kw: object) -> waiting.WaitFacts:
    return waiting.WaitFacts(FLEET[:1], queued, **kw)  # type: ignore[arg-type]


def test_a_job_at_its_limit_waits_for_that_alone() -> None:
    j = job(1, device_id="box:gpu0")
    snap = _snap([j], limits=SubmitterLimits(default=2), held={"alice": 2})
    assert waiting.waiting_for(j, snap) == [waiting.Blocker(submitter_limit=2, submitter="alice")]


def test_a_job_under_its_limit_waits_for_devices() -> None:
    j = job(1, device_id="box:gpu0")
    snap = _snap([j], limits=SubmitterLimits(default=2), held={"alice": 1})
    assert waiting.waiting_for(j, snap) == [waiting.Blocker("box:gpu0")]


def test_a_job_waiting_for_others_names_each_not_yet_ended() -> None:
    j = job(1, device_id="box:gpu0", after_open=2)
    snap = _snap([j], after={"j1": ["a1", "a2"]}, limits=SubmitterLimits(default=0))
    assert waiting.waiting_for(j, snap) == [
        waiting.Blocker(after="a1"),
        waiting.Blocker(after="a2"),
    ]


def test_the_words() -> None:
    at_limit = [waiting.Blocker(submitter_limit=4, submitter="alice")]
    assert waiting.summary(at_limit, 0, pinned=False) == "at the limit of 4 devices for alice"
    assert waiting.summary(at_limit, 0, pinned=True) == "at the limit of 4 devices for alice"
    assert waiting.cell(at_limit, pinned=False) == (
        "submitter_limit: at the limit of 4 devices for alice"
    )
    ids = ["0123456789ab", "fedcba987654"]
    after = [waiting.Blocker(after=i) for i in ids]
    assert waiting.summary(after, 0, pinned=False) == (
        "after job 01234567…, fedcba98…, not ended yet"
    )
    assert waiting.cell(after, pinned=True) == "after 01234567…, fedcba98…"


def test_entries_read_back_from_the_wire() -> None:
    entries = [
        {"submitter_limit": 4, "submitter": "alice"},
        {"after": "j1"},
        {"submitter_limit": True, "submitter": 3},  # unreadable values read as absent
    ]
    assert waiting.blockers_from_wire(entries) == [
        waiting.Blocker(submitter_limit=4, submitter="alice"),
        waiting.Blocker(after="j1"),
        waiting.Blocker(),
    ]


def test_names_at_their_limit_whatever_they_ask() -> None:
    lim = SubmitterLimits(default=2, names={"z": 0, "y": 5})
    held = {"a": 2, "b": 1, "c": 3, "y": 4}
    assert share.at_limit(lim, held) == ["a", "c", "z"]
    assert share.at_limit(share.NO_LIMITS, held) == []
