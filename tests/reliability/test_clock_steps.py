"""Clock steps: the controller's wall clock jumps forward by hours and back, mid-flight.

The controller judges silence, lease deadlines, the start-up hold-off and the flap
guard by one wall clock (``Clock.now``, Unix seconds: stored timestamps must mean the
same after a restart), so a step of that clock (an NTP correction, a suspended VM) is
seen by every rule at once. Real time cannot be moved, so the injected ``FakeClock``
steps instead: a ``Store`` on a real SQLite file with reaper passes taken the way
``controller.loops.reaper`` takes them (``Reaper`` below), a real served controller
for the read routes, and the store model test with a rule that steps back.

What must hold through any step: never two live leases on a device; a forward step
expires only what the rules say, into quarantine (``unhealthy``), never into the pool;
a backward step never revives what ended, never frees a device and never makes a
silent worker look fresher than its last heartbeat; no rule, view or route fails on a
negative duration.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from resource_controller.clock import FakeClock
from resource_controller.controller import serve
from resource_controller.controller.deps import Settings
from resource_controller.core import expiry
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.records import SweepResult
from store.dbview import Raw, invariant_violations, wid
from store.test_state_machine import StoreMachine
from support import store_helpers
from support.served import ServedController

HOUR = 3600
INTERVAL = expiry.SWEEP_INTERVAL
DEVICE = "h0:gpu0"
TOKENS = "wtok:worker,ctok:client,atok:admin"


class Reaper:
    """The reaper loop's decisions, one pass per call, on the fake clock.

    As ``loops.reaper``: the hold-off fixed at start, the stall guard seeded with the
    start instant and advanced at every pass, judging only when both allow.
    """

    def __init__(
        self, store: Store, clock: FakeClock, hold_off: float = 0.0, up_for: float = 0.0
    ) -> None:
        # ``up_for``: the controller started that long ago, its last pass just now.
        self.store, self.clock = store, clock
        self.hold_off_until = clock.now() - up_for + hold_off
        self.guard = expiry.StallGuard(previous=clock.now())

    def run(self) -> SweepResult:
        self.guard = self.guard.after_pass(self.clock.now(), INTERVAL)
        rules = expiry.SweepRules(
            hold_off_until=self.hold_off_until, stalled=not self.guard.may_judge
        )
        return self.store.devices.sweep(rules)

    def on_schedule(self, passes: int, heartbeat: list[str] | None = None) -> list[SweepResult]:
        """``passes`` passes one interval apart; before each, h0 names ``heartbeat`` (None: silent)."""
        out = []
        for _ in range(passes):
            self.clock.advance(INTERVAL)
            if heartbeat is not None:
                self.store.reports.heartbeat(wid("h0"), heartbeat)
            out.append(self.run())
        return out


@pytest.fixture
def raw(store: Store, tmp_path: Path) -> Iterator[Raw]:
    r = Raw(tmp_path / "rc.db")
    try:
        yield r
    finally:
        r.close()


def fleet(store: Store) -> None:
    store.devices.register("h0", "boot-1", [("gpu0", 0)])


def running(store: Store, hold_ttl: int = 0) -> str:
    """A job handed to h0 on ``DEVICE`` (a hold of ``hold_ttl`` seconds if > 0): its ID."""
    if hold_ttl:
        req = NewJob(["hold"], "alice", device_id=DEVICE, kind="hold", max_runtime_seconds=hold_ttl)
    else:
        req = NewJob(["run"], "alice", device_id=DEVICE)
    job = store.queue.enqueue(req)
    assert [a.job_id for a in store.queue.run_pass().assigned] == [job.id]
    handed, _ = store.reports.take_work(wid("h0"))
    assert [j.id for j in handed] == [job.id]  # a hold too: its worker knows it holds
    return job.id


def device(store: Store) -> tuple[str, str]:
    d = store_helpers.device(store, DEVICE)
    assert d is not None
    return d.state, d.quarantine_reason


def live(store: Store) -> list[str]:
    return [x.job_id for x in store_helpers.live_leases(store) if x.device_id == DEVICE]


def assert_sound(raw: Raw) -> None:
    assert invariant_violations(raw) == []  # STORE-180..182: one live lease per device


# ---- forward ---------------------------------------------------------------------------


def test_hours_forward_with_the_worker_heartbeating_loses_nothing(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    fleet(store)
    job = running(store)
    reaper = Reaper(store, clock)
    reaper.on_schedule(3, heartbeat=[job])
    clock.advance(6 * HOUR)  # the wall clock steps; the worker carries on heartbeating
    first = reaper.run()
    # The gap looks like a paused controller: only unknown, nobody judged.
    assert not first.judging and first.jobs_lost == [] and first.leases_expired == []
    assert device(store) == ("unknown", "")
    for result in reaper.on_schedule(expiry.RESUME_PASSES + 3, heartbeat=[job]):
        assert result.jobs_lost == [] and result.leases_expired == []
        assert_sound(raw)
    assert store.views.job(job).state == "running"
    assert device(store) == ("busy", "")
    (lease,) = store_helpers.live_leases(store)
    assert lease.expires_at == store.now() + 900  # renewed on the new timeline


def test_hours_forward_with_the_worker_silent_quarantines_never_frees(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    fleet(store)
    job = running(store)
    reaper = Reaper(store, clock)
    reaper.on_schedule(3, heartbeat=[job])
    queued = store.queue.enqueue(NewJob(command=["next"], submitter="bob", device_id=DEVICE))
    clock.advance(5 * HOUR)
    results = [reaper.run(), *reaper.on_schedule(expiry.RESUME_PASSES)]
    assert [r.judging for r in results] == [False, False, False, True]
    assert results[-1].jobs_lost == [job]  # written off once judging resumes
    assert device(store) == ("unhealthy", "worker_lost")
    assert store.views.job(job).kill_reason == "worker lost"
    assert store.queue.run_pass().assigned == []  # a quarantined device is handed to nobody
    assert store.views.job(queued.id).state == "queued"
    assert_sound(raw)


def test_hours_forward_expires_a_hold_into_quarantine(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    fleet(store)
    hold = running(store, hold_ttl=600)
    reaper = Reaper(store, clock)
    reaper.on_schedule(3, heartbeat=[])
    clock.advance(2 * HOUR)  # far past the hold's TTL
    reaper.run()
    assert store.views.job(hold).state == "running"  # the stalled pass judges nothing
    results = reaper.on_schedule(expiry.RESUME_PASSES, heartbeat=[])
    assert results[-1].leases_expired == [hold]
    assert (
        store.views.job(hold).state == "lost"
        and store.views.job(hold).kill_reason == "lease expired"
    )
    assert device(store) == ("unhealthy", "lease_expired")  # STORE-103: not back in the pool
    assert store.queue.run_pass().assigned == []
    assert_sound(raw)


def test_a_forward_step_during_the_hold_off_still_waits_for_steady_passes(
    store: Store, clock: FakeClock
) -> None:
    # The step carries the clock past the hold-off instant at once; the stall guard
    # still keeps the first passes after it from judging.
    fleet(store)
    job = running(store)
    reaper = Reaper(store, clock, hold_off=expiry.HOLD_OFF)
    clock.advance(HOUR)
    assert not reaper.run().judging
    assert store.views.job(job).state == "running"


# ---- backward --------------------------------------------------------------------------


def test_hours_back_mid_lease_renews_on_the_new_timeline_and_judges_silence_from_it(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    fleet(store)
    job = running(store)
    reaper = Reaper(store, clock, hold_off=expiry.HOLD_OFF, up_for=10 * HOUR)
    reaper.on_schedule(3, heartbeat=[job])
    clock.advance(-3 * HOUR)
    for result in reaper.on_schedule(100, heartbeat=[job]):  # 1000 s, longer than a lease
        assert result.jobs_lost == [] and result.leases_expired == [] and result.judging
    assert store.views.job(job).state == "running" and device(store) == ("busy", "")
    assert [x.expires_at for x in store_helpers.live_leases(store)] == [store.now() + 900]
    # Silence is counted from the last heartbeat on the stepped-back clock: 300 s of it
    # write the worker off, as on any other timeline.
    results = reaper.on_schedule(30)
    assert [r.jobs_lost for r in results if r.jobs_lost] == [[job]]
    assert device(store) == ("unhealthy", "worker_lost")
    assert_sound(raw)


def test_a_backward_step_does_not_revive_an_expired_lease_or_a_written_off_worker(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    store.devices.register("h0", "boot-1", [("gpu0", 0), ("gpu1", 0)])
    job = running(store)
    hold = store.queue.enqueue(
        NewJob(
            command=["hold"],
            submitter="a",
            device_id="h0:gpu1",
            kind="hold",
            max_runtime_seconds=60,
        )
    )
    assert [a.job_id for a in store.queue.run_pass().assigned] == [hold.id]
    reaper = Reaper(store, clock)
    reaper.on_schedule(70, heartbeat=[job])  # 700 s: past the hold's TTL and margin
    assert store.views.job(hold.id).state == "lost"
    reaper.on_schedule(31)  # the worker falls silent: written off
    assert store.views.job(job).state == "lost"
    before = {d.id: (d.state, d.quarantine_reason) for d in store_helpers.devices(store)}
    assert before == {
        DEVICE: ("unhealthy", "worker_lost"),
        "h0:gpu1": ("unhealthy", "lease_expired"),
    }
    clock.advance(-2 * HOUR)  # now earlier than every deadline that already passed
    store.reports.heartbeat(wid("h0"), [job, hold.id])  # the worker is back and names both
    reaper.on_schedule(3, heartbeat=[job, hold.id])
    assert store.views.job(job).state == "lost" and store.views.job(hold.id).state == "lost"
    assert {d.id: (d.state, d.quarantine_reason) for d in store_helpers.devices(store)} == before
    assert store_helpers.live_leases(store) == []
    assert store.queue.run_pass().assigned == []
    assert_sound(raw)


def test_a_backward_step_past_the_start_reenters_the_hold_off_and_frees_nothing(
    store: Store, clock: FakeClock
) -> None:
    # The hold-off instant is fixed on the wall clock at start (SRV-032): a step back
    # past the start instant puts the controller inside its hold-off again until the
    # clock catches up. The cost is expiry coming later; nothing is freed or lost.
    fleet(store)
    job = running(store)
    reaper = Reaper(store, clock, hold_off=expiry.HOLD_OFF)
    clock.advance(-HOUR)
    results = reaper.on_schedule(40)  # 400 s of silence, all before the hold-off instant
    assert not any(r.judging for r in results)
    assert store.views.job(job).state == "running" and device(store) == ("busy", "")


def test_a_silent_worker_is_judged_from_its_last_heartbeat_after_a_step_back(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    # Silence is ``now - last_heartbeat_at`` on the wall clock (STORE-100), so a worker
    # that died just before a step back of an hour is noticed an hour later than it
    # would have been: until the clock is past its last heartbeat it is not silent at
    # all. Late, never wrong: its devices stay out of reach (busy), nothing is freed.
    fleet(store)
    job = running(store)
    reaper = Reaper(store, clock, up_for=10 * HOUR)
    reaper.on_schedule(1, heartbeat=[job])
    heard = store.now()  # the worker's last word
    clock.advance(-HOUR)
    results = reaper.on_schedule(int(HOUR // INTERVAL))
    assert all(r.devices_unknown == [] and r.jobs_lost == [] for r in results)
    assert device(store) == ("busy", "") and store_helpers.live_leases(store) != []
    assert store.now() == heard  # the clock has caught up with the last heartbeat
    reaper.on_schedule(3)
    assert device(store) == ("unknown", "")  # grace: 30 s after the last heartbeat
    lost_at = next(store.now() for _ in range(40) if reaper.on_schedule(1)[0].jobs_lost == [job])
    assert lost_at - heard == expiry.UNHEALTHY_AFTER
    assert device(store) == ("unhealthy", "worker_lost")
    assert_sound(raw)


def test_a_backward_step_after_a_recovery_keeps_the_flap_guard_counting(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    # Recoveries stamped "in the future" after a step back stay inside the window, so
    # the guard holds a flapping device back no less than it would have.
    fleet(store)
    proof = expiry.Proof(isolated=True)
    for _ in range(expiry.FLAP_LIMIT):
        raw.force_device(DEVICE, "unhealthy", "worker_lost")  # as a write-off leaves it
        assert [r.device_id for r in store.devices.auto_recover(wid("h0"), proof).recovered] == [
            DEVICE
        ]
        clock.advance(60)
    clock.advance(-2 * HOUR)
    raw.force_device(DEVICE, "unhealthy", "worker_lost")
    out = store.devices.auto_recover(wid("h0"), proof)
    assert out.recovered == [] and out.held_back == [DEVICE]
    assert device(store) == ("unhealthy", "worker_lost")
    store_helpers.recovery_history(store, DEVICE)  # the read tolerates stamps in the future


def test_priority_aging_ages_nothing_on_a_clock_behind_the_queue(tmp_path: Path) -> None:
    clock = FakeClock()
    store = Store(tmp_path / "rc.db", clock, priority_aging=60)
    try:
        fleet(store)
        first = running(store)
        a = store.queue.enqueue(NewJob(command=["a"], submitter="x", device_id=DEVICE))
        clock.advance(-HOUR)
        b = store.queue.enqueue(NewJob(command=["b"], submitter="x", device_id=DEVICE, priority=1))
        assert [j.id for j in store.views.queued()] == [b.id, a.id]  # priority still rules
        store_helpers.release(store, first, "succeeded", 0, "done")
        assert [x.job_id for x in store.queue.run_pass().assigned] == [b.id]
    finally:
        store.close()


# ---- the drain, and every read on a stepped clock ----------------------------------------


def test_a_draining_device_through_steps_both_ways(
    store: Store, clock: FakeClock, raw: Raw
) -> None:
    fleet(store)
    job = running(store)
    store.devices.drain(DEVICE, "ops", "swap")
    reaper = Reaper(store, clock)
    reaper.on_schedule(2, heartbeat=[job])
    clock.advance(-HOUR)
    reaper.on_schedule(2, heartbeat=[job])
    store_helpers.release(store, job, "succeeded", 0, "done")
    queued = store.queue.enqueue(NewJob(command=["n"], submitter="b", device_id=DEVICE))
    clock.advance(3 * HOUR)
    reaper.on_schedule(4, heartbeat=[])
    assert (
        store.queue.run_pass().assigned == []
    )  # draining: nothing new placed, whichever way time went
    assert store.views.job(queued.id).state == "queued"
    assert_sound(raw)


@pytest.mark.parametrize("step", [-6 * HOUR, 6 * HOUR])
def test_every_read_route_answers_after_a_step(step: int, tmp_path: Path) -> None:
    """Ages and waits computed across a step (negative ones included) never fail a read."""
    clock = FakeClock()
    settings_ = Settings(schedule_interval=30.0, sweep_interval=HOUR)  # no pass behind our back
    svc = serve.open_services(tmp_path / "data", TOKENS, settings_, clock)
    server = ServedController(svc)
    server.start()
    worker, admin = (
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {t}"}, timeout=15)
        for t in ("wtok", "atok")
    )
    try:
        r = worker.post("/v1/workers/register", json={"host": "h0", "devices": [{"name": "gpu0"}]})
        assert r.status_code == 200, r.text
        worker_id = r.json()["worker_id"]

        def submit(**fields: object) -> str:
            body = {"submitter": "alice", "device_id": DEVICE, **fields}
            if fields.get("kind") != "hold":
                body["command"] = ["train"]
            r = admin.post("/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        done = submit()
        r = worker.get(f"/v1/workers/{worker_id}/assignments", params={"wait": "100ms"})
        assert [a["job_id"] for a in r.json()["assignments"]] == [done]
        running_now, hold = submit(), submit(kind="hold", max_runtime_seconds=600)
        r = worker.post(
            f"/v1/jobs/{done}/status",
            json={"worker_id": worker_id, "state": "succeeded", "exit_code": 0},
        )
        assert r.status_code < 300, r.text
        clock.advance(step)
        paths = [
            "/v1/devices",
            "/v1/state",
            "/v1/jobs",
            f"/v1/jobs/{done}",
            f"/v1/jobs/{running_now}",
            f"/v1/jobs/{hold}",
            f"/v1/devices/{DEVICE}/describe",
            "/v1/explain?selector=host%3Dh0",
            "/metrics",
            "/healthz",
            "/",
        ]
        for path in paths:
            got = admin.get(path)
            assert got.status_code == 200, (path, got.status_code, got.text[:300])
        # The stepped clock still takes writes: a heartbeat and a new submission.
        r = worker.post(f"/v1/workers/{worker_id}/heartbeat", json={"running_job_ids": []})
        assert r.status_code < 300, r.text
        submit()
    finally:
        worker.close()
        admin.close()
        server.stop()


# ---- the store model with steps back ----------------------------------------------------


class SteppingMachine(StoreMachine):
    """The store model test with one more rule: the wall clock steps back.

    The model's predictions are written from the stored timestamps and ``now``, so they
    stay right across a step; what this adds is every other rule running on a clock that
    is behind what the database already holds.
    """

    @rule(seconds=st.sampled_from([1, 31, 301, 901, HOUR]))
    def step_back(self, seconds: int) -> None:
        self.clock.advance(-seconds)


@pytest.mark.timeout(600)  # CPU-bound like the model test itself: no wait to hang on
def test_the_store_model_holds_with_steps_back() -> None:
    run_state_machine_as_test(
        SteppingMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
