"""The usage rollup (EXT-ACCT-1, EXT-ACCT-2): every released lease, summed as it ends.

Time moves only through the ``FakeClock`` (which starts on a whole hour). Figures are
read through ``Store.usage``, the same call ``GET /v1/usage`` makes, and checked against
what the leases held.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resource_controller.clock import FakeClock
from resource_controller.core import usage
from resource_controller.core.expiry import SweepRules
from resource_controller.store import engine
from resource_controller.store.facade import Store
from resource_controller.store.records import GpuUse
from support import store_helpers

from .dbview import wid

if TYPE_CHECKING:
    from conftest import Factory

DAY = 86_400


def report(store: Store, job_id: str, state: str = "succeeded", gpu: GpuUse | None = None) -> None:
    """The worker's terminal report, its ownership checks passed."""
    store.reports.status(job_id, lambda _job: None, state, 0, "", gpu or GpuUse())


def table(store: Store, by: str = "submitter", since: int = 7 * DAY) -> dict[str, usage.Figures]:
    return {g.key: g.figures for g in store.views.usage(by, since).groups}


def test_a_reported_job_keeps_its_gpu_use_and_adds_its_held_time(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # EXT-ACCT-1: the outcome carries what was measured; EXT-ACCT-2: held time x devices,
    # weighted by the mean utilisation into GPU-hours.
    d0, _ = make.worker()
    job = make.start(d0, submitter="alice")
    clock.advance(3600)
    report(store, job.id, gpu=GpuUse(util_mean=50.0, mem_peak_bytes=3 << 30, samples=360))
    ended = store.views.job(job.id)
    assert (ended.gpu_util_mean, ended.gpu_mem_peak_bytes, ended.gpu_samples) == (
        50.0,
        3 << 30,
        360,
    )
    assert table(store) == {"alice": usage.Figures(1, 3600, 3600, 1800.0)}
    assert table(store, "device") == {d0: usage.Figures(1, 3600, 3600, 1800.0)}
    assert table(store, "host") == {"box": usage.Figures(1, 3600, 3600, 1800.0)}


def test_nothing_measured_leaves_the_fields_absent_and_the_gpu_hours_unknown(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # EXT-ACCT-1: absent, not zero, when nothing was sampled.
    d0, _ = make.worker()
    job = make.start(d0)
    clock.advance(90)
    report(store, job.id)
    ended = store.views.job(job.id)
    assert (ended.gpu_util_mean, ended.gpu_mem_peak_bytes, ended.gpu_samples) == (None, None, None)
    (group,) = store.views.usage("submitter", DAY).groups
    assert group.figures == usage.Figures(1, 90, 0, 0.0)
    assert usage.gpu_hours(group.figures) is None


def test_a_gang_counts_once_for_its_submitter_and_host_and_once_per_device(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    d0, d1 = make.worker()
    job = make.start(submitter="bob", count=2)
    clock.advance(600)
    report(store, job.id, gpu=GpuUse(util_mean=25.0, samples=4))
    assert table(store) == {"bob": usage.Figures(1, 1200, 1200, 300.0)}
    assert table(store, "host") == {"box": usage.Figures(1, 1200, 1200, 300.0)}
    assert table(store, "device") == {
        d0: usage.Figures(1, 600, 600, 150.0),
        d1: usage.Figures(1, 600, 600, 150.0),
    }


def test_groups_come_largest_first_with_their_share_and_the_fleet_total(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    d0, d1 = make.worker()
    a = make.start(d0, submitter="alice")
    b = make.start(d1, submitter="bob")
    clock.advance(100)
    report(store, a.id)
    clock.advance(200)
    report(store, b.id)
    w = store.views.usage("submitter", DAY)
    assert [g.key for g in w.groups] == ["bob", "alice"]
    assert w.total == usage.Figures(2, 400, 0, 0.0)
    assert [usage.share(g.figures, w.total) for g in w.groups] == [0.75, 0.25]
    assert w.more == 0
    capped = store.views.usage("submitter", DAY, limit=1)
    assert [g.key for g in capped.groups] == ["bob"] and capped.more == 1
    assert capped.total == w.total  # the total counts every group


def test_the_window_starts_on_the_hour_that_holds_now_minus_since(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    d0, _ = make.worker()
    old = make.start(d0, submitter="alice")
    clock.advance(100)
    report(store, old.id)  # ends in hour H
    clock.advance(2 * 3600)  # now in hour H+2
    new = make.start(d0, submitter="alice")
    clock.advance(50)
    report(store, new.id)
    now = store.now()
    # since 1h: the window starts at the beginning of hour H+1: only the new job.
    w = store.views.usage("submitter", 3600)
    assert w.start == (now - 3600) // 3600 * 3600 and w.end == now
    assert table(store, since=3600) == {"alice": usage.Figures(1, 50, 0, 0.0)}
    # since 3h reaches back into hour H-1: both.
    assert table(store, since=3 * 3600) == {"alice": usage.Figures(2, 150, 0, 0.0)}


def test_jobs_that_never_held_a_device_add_nothing(store: Store, make: Factory) -> None:
    (d0,) = make.worker(devices=1)
    make.start(d0)
    queued = make.submit(device=d0)
    assert store.queue.cancel(queued.id, "killed by alice")
    assert table(store, since=DAY) == {}


@pytest.mark.parametrize("how", ["expiry", "write_off", "finalize"])
def test_lost_and_finalized_jobs_count_the_time_they_held(
    store: Store, make: Factory, clock: FakeClock, how: str
) -> None:
    # Every way a lease ends goes through the rollup: expiry (STORE-103), a written-off
    # worker (STORE-102), a kill finalised at the controller (STORE-092).
    (d0,) = make.worker(devices=1)
    job = make.start(d0, submitter="k")
    if how == "expiry":
        clock.advance(300)  # alive, but nobody renews the lease: it lapses at 300 s
        store.reports.heartbeat(wid(), [])
        store.devices.sweep(SweepRules())
        held = 300
    elif how == "write_off":
        clock.advance(30)
        store.devices.sweep(SweepRules())  # silent for 30 s: unknown
        clock.advance(270)
        store.devices.sweep(SweepRules())  # and at 5 min written off, its job lost
        held = 300
    else:
        clock.advance(31)
        store.devices.sweep(SweepRules())
        outcome = store.queue.request_kill(job.id, "killed by k", finalize_disconnected=True)
        assert outcome.value == "finalized"
        held = 31
    assert store.views.job(job.id).state in ("lost", "killed")
    assert table(store, since=DAY) == {"k": usage.Figures(1, held, 0, 0.0)}


def test_an_expired_gang_counts_once(store: Store, make: Factory, clock: FakeClock) -> None:
    make.worker(devices=2)
    job = make.start(submitter="g", count=2)
    clock.advance(300)
    store.reports.heartbeat(wid(), [])
    store.devices.sweep(SweepRules())
    assert store.views.job(job.id).state == "lost"
    assert table(store, since=DAY) == {"g": usage.Figures(1, 600, 0, 0.0)}


def test_a_repeated_report_adds_nothing(store: Store, make: Factory, clock: FakeClock) -> None:
    # API-038 step 6: an already-terminal job is a silent success that changes nothing.
    d0, _ = make.worker()
    job = make.start(d0)
    clock.advance(10)
    report(store, job.id, gpu=GpuUse(util_mean=10.0, samples=1))
    report(store, job.id, gpu=GpuUse(util_mean=90.0, samples=9))
    assert table(store, since=DAY) == {"alice": usage.Figures(1, 10, 10, 1.0)}
    assert store.views.job(job.id).gpu_util_mean == 10.0


def test_a_clock_stepped_back_never_breaks_the_running_sums(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    d0, _ = make.worker()
    first = make.start(d0)
    clock.advance(2 * 3600 + 5)
    report(store, first.id)
    clock.advance(-2 * 3600)  # a stepped clock: two hours back
    second = make.start(d0)
    clock.advance(5)
    report(store, second.id)
    assert table(store, since=DAY) == {"alice": usage.Figures(2, 7210, 0, 0.0)}


def test_device_and_submitter_pairs_for_metrics(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # EXT-ACCT-3: rc_device_held_seconds_total and rc_job_gpu_util by device and submitter.
    d0, d1 = make.worker()
    a = make.start(d0, submitter="alice")
    clock.advance(60)
    report(store, a.id, gpu=GpuUse(util_mean=70.0, samples=6))
    b = make.start(d1, submitter="alice")
    clock.advance(40)
    report(store, b.id)
    pairs = {(p.device_id, p.submitter): p for p in store.views.usage_pairs(DAY)}
    assert pairs[(d0, "alice")].held_seconds == 60 and pairs[(d0, "alice")].last_util == 70.0
    assert pairs[(d1, "alice")].held_seconds == 40 and pairs[(d1, "alice")].last_util is None
    clock.advance(3 * DAY)
    assert store.views.usage_pairs(DAY) == []  # only pairs active in the window are listed


def test_a_grouping_the_rollup_does_not_keep_is_refused(store: Store) -> None:
    with pytest.raises(usage.UsageError, match="by: 'pair'"):
        store.views.usage("pair", DAY)


def test_usage_survives_the_retention_pass(store: Store, make: Factory, clock: FakeClock) -> None:
    # EXT-KEEP-1 deletes stored output only; the rollup never reads job rows anyway.
    d0, _ = make.worker()
    job = make.start(d0)
    clock.advance(20)
    report(store, job.id)
    clock.advance(DAY)
    assert store.views.logs_to_prune(60, 10) == [job.id]
    store.views.mark_logs_pruned([job.id])
    assert table(store, since=2 * DAY) == {"alice": usage.Figures(1, 20, 0, 0.0)}


def test_a_store_from_before_accounting_fills_the_rollup_from_its_leases(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Migration 0011: the history released before it answers too (no utilisation known).
    from alembic import command

    path = tmp_path / "old.db"
    eng = engine.create_engine(path)
    try:
        with eng.connect() as conn:
            command.upgrade(engine._alembic_config(conn), "0009")
            conn.commit()
    finally:
        eng.dispose()
    t0 = int(clock.now())
    rows = [
        ("l1", "j1", "box:gpu0", "alice", t0 - 10800, t0 - 7200),  # 1 h, in hour H-2
        ("l2", "j2", "box:gpu0", "alice", t0 - 600, t0 - 300),
        ("l3", "j3", "box:gpu1", "bob", t0 - 600, t0 - 300),
        ("l4", "j3", "box:gpu0", "bob", t0 - 100, t0 - 50),  # a second device of j3
        ("l5", "j4", "box:gpu1", "carol", t0 - 10, None),  # live: not yet counted
    ]
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO leases (id, job_id, device_id, holder, acquired_at, expires_at,"
            " released_at) VALUES (?, ?, ?, ?, ?, 0, ?)",
            rows,
        )
    db.close()
    store = Store(path, clock)
    try:
        assert table(store, since=DAY) == {
            "alice": usage.Figures(2, 3900, 0, 0.0),
            "bob": usage.Figures(1, 350, 0, 0.0),
        }
        assert table(store, since=1800) == {
            "alice": usage.Figures(1, 300, 0, 0.0),
            "bob": usage.Figures(1, 350, 0, 0.0),
        }
        assert table(store, "device", DAY) == {
            "box:gpu0": usage.Figures(3, 3950, 0, 0.0),
            "box:gpu1": usage.Figures(1, 300, 0, 0.0),
        }
        # The rollup goes on from there.
        store.devices.register("box", "b", [("gpu0", 0), ("gpu1", 0)])
        job = store_helpers.allocate_directly(store, "box:gpu0", "alice")
        clock.advance(100)
        report(store, job.id, gpu=GpuUse(util_mean=100.0, samples=1))
        assert table(store, since=DAY)["alice"] == usage.Figures(3, 4000, 100, 100.0)
    finally:
        store.close()


def test_bad_since_text_is_refused_naming_it() -> None:
    for bad in ("", "7", "7x", "-7d", "0d", "d", "1e9d", "7d junk", "99999999999d"):
        with pytest.raises(usage.UsageError, match="since"):
            usage.parse_since(bad)
    assert usage.parse_since("7d") == 7 * DAY
    assert usage.parse_since("2w") == 14 * DAY
    assert usage.parse_since("1d12h") == 36 * 3600
    assert usage.parse_since("90m") == 5400
    assert usage.parse_since("1.5h") == 5400
