"""The real Store driven by random operation sequences, checked against a small model.

After every step the database must satisfy the invariants of store.md §24 (STORE-180..182,
184..186) and every job must be in the state the model predicts from the operations'
own answers. The ``sweep`` rule predicts each sweep's verdicts from the rows it reads
beforehand (worker heartbeats, device states, live leases) with the spec's rules written
out independently here, then checks the store reached exactly those, and that no sweep
moved any device to ``ready`` (STORE-183). Devices are modelled too: each rule names the
operations it may perform, and after every step each device's observed move (from its
state before the step to its state after, ``None`` for no row) must be reachable by the
edges of those operations in the table below, written out here from STORE-021
independently of ``core.transitions``. Clock jumps (``advance``, ``silence``) make
workers silent and leases lapse; the ``device_event`` rule can still write a demotion
directly, in retention-mode fashion (devices demoted, jobs untouched; STORE-105), to reach
those states without waiting. ``pytest --hypothesis-show-statistics`` lists the events
below, i.e. how often the interesting paths were reached.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core import selectors
from resource_controller.core.expiry import Proof, SweepRules
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers

from .dbview import Raw, invariant_violations, wid

HOSTS = ("h0", "h1")
SELECTORS = ("kind=a", "kind=b", "kind!=a", "idx>=1", "idx<=0,kind=a")
ACTIVE = ("assigned", "running")
TERMINAL = ("succeeded", "failed", "killed", "lost")
RECOVERABLE = ("worker_lost", "lease_expired", "registration")
GRACE, UNHEALTHY_AFTER, FLAP_LIMIT, FLAP_WINDOW = 30, 300, 3, 3600
WINDOWS = st.sampled_from(["judging", "at_hold_off", "past_hold_off", "inside", "stalled"])
JUMPS = st.sampled_from([0, 0, 30, 300, 900])
_ANY = frozenset({"ready", "busy", "unknown", "unhealthy"})
_OUT = frozenset({"ready", "busy", "unknown"})
#: STORE-021, one entry per operation: (from states, to states); None = no row.
DEVICE_TABLE: dict[str, tuple[frozenset[str | None], frozenset[str | None]]] = {
    "register a new device": (frozenset({None}), frozenset({"ready"})),
    "assign": (frozenset({"ready"}), frozenset({"busy"})),
    "release": (frozenset({"busy"}), frozenset({"ready"})),
    "sweep: silent >= grace": (frozenset({"ready", "busy"}), frozenset({"unknown"})),
    "sweep: written off": (_OUT, frozenset({"unhealthy"})),
    "sweep: lease expired": (_OUT, frozenset({"unhealthy"})),
    "registration reap": (_OUT, frozenset({"unhealthy"})),
    "registration reap, reboot proof": (frozenset({"busy", "unknown"}), frozenset({"ready"})),
    "registration, reboot proof": (frozenset({"unhealthy"}), frozenset({"ready"})),
    "registration re-declares": (_OUT, frozenset({"ready"})),
    "fault report": (_ANY, frozenset({"unhealthy"})),
    "heartbeat: unknown -> busy": (frozenset({"unknown"}), frozenset({"busy"})),
    "heartbeat: worker_lost -> busy": (frozenset({"unhealthy"}), frozenset({"busy"})),
    "heartbeat: unknown -> ready": (frozenset({"unknown"}), frozenset({"ready"})),
    "auto-recovery": (frozenset({"unhealthy"}), frozenset({"ready"})),
    "operator clear": (frozenset({"unhealthy"}), frozenset({"ready"})),
    "retire": (_ANY, frozenset({None})),
}
REGISTRATION = (
    "register a new device",
    "registration reap",
    "registration reap, reboot proof",
    "registration, reboot proof",
    "registration re-declares",
)
HEARTBEAT = (
    "heartbeat: unknown -> busy",
    "heartbeat: worker_lost -> busy",
    "heartbeat: unknown -> ready",
)
SWEEP = ("sweep: silent >= grace", "sweep: written off", "sweep: lease expired")


def reachable(ops: set[str], start: str | None) -> set[str | None]:
    """Every state a device in ``start`` can reach by edges of ``ops`` (zero or more)."""
    seen: set[str | None] = {start}
    frontier = [start]
    while frontier:
        here = frontier.pop()
        for op in ops:
            sources, targets = DEVICE_TABLE[op]
            if here in sources:
                for there in targets - seen:
                    seen.add(there)
                    frontier.append(there)
    return seen


PROOFS = (
    Proof(isolated=True),
    Proof(survivors_checked=True),
    Proof(),
    Proof(survivors_checked=True, survivors_found=True),
)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rc-store-sm-"))
        self.clock = FakeClock()
        self.store = Store(self.dir / "rc.db", self.clock)
        self.raw = Raw(self.dir / "rc.db")
        self.expected: dict[str, str] = {}  # job -> state the model predicts
        self.spec: dict[str, tuple[str, str, int]] = {}  # job -> (pinned device, selector, R)
        self.worker_of: dict[str, str] = {}  # job -> worker ID, once assigned
        self.finished: dict[str, tuple[object, ...]] = {}  # terminal job -> its final fields
        self.keys: dict[str, str] = {}  # idempotency key -> job
        self.labels: dict[str, dict[str, str]] = {}  # device -> labels
        self.boots: dict[str, int] = {}
        self.faulted: set[str] = set()  # devices whose last word was a fault report
        self.recovered_at: dict[str, list[int]] = {}  # device -> automatic recoveries
        self.device_seen: dict[str, str] = {}  # device -> state after the last step
        self.step_ops: set[str] = set()  # device operations the current step may perform

    def teardown(self) -> None:
        self.store.close()
        self.raw.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers ---------------------------------------------------------------------

    def _jobs_in(self, *states: str) -> list[str]:
        # Insertion order, never UUID order: draws must not depend on random IDs.
        return [j for j, s in self.expected.items() if s in states]

    def _pick(self, data: st.DataObject, *prefer: str) -> str:
        """A job, usually one in a ``prefer`` state, sometimes any (to hit refusals)."""
        preferred = self._jobs_in(*prefer)
        if preferred and data.draw(st.integers(0, 4)) > 0:
            return data.draw(st.sampled_from(preferred))
        return data.draw(st.sampled_from(list(self.expected)))

    def _may(self, *ops: str) -> None:
        """This step may move devices by these operations (STORE-021), and by no other."""
        self.step_ops.update(ops)

    def _device_state(self, device_id: str) -> tuple[str, str]:
        d = store_helpers.device(self.store, device_id)
        assert d is not None
        return d.state, d.quarantine_reason

    def _finish(self, job_id: str, state: str, kill_reason: str | None = None) -> None:
        self.expected[job_id] = state
        j = self.store.views.job(job_id)
        assert j.state == state
        assert kill_reason is None or j.kill_reason == kill_reason, (j.kill_reason, kill_reason)
        self.finished[job_id] = (j.state, j.exit_code, j.kill_reason, j.finished_at)

    # ---- rules -------------------------------------------------------------------------

    @initialize(data=st.data(), n=st.integers(2, 6))
    def fleet_and_backlog(self, data: st.DataObject, n: int) -> None:
        self.register(HOSTS[0], 2, reboot=False, ceilings=(0, 0))
        self.register(HOSTS[1], 1, reboot=False, ceilings=(600,))
        for _ in range(n):
            self._submit_one(data)

    @rule(
        host=st.sampled_from(HOSTS),
        n=st.integers(1, 3),
        reboot=st.booleans(),
        ceilings=st.tuples(*[st.sampled_from([0, 0, 600])] * 3),
    )
    def register(self, host: str, n: int, reboot: bool, ceilings: tuple[int, ...]) -> None:
        # STORE-110/111: every assigned/running job of this worker is reaped as lost.
        self._may(*REGISTRATION)
        if reboot or host not in self.boots:
            self.boots[host] = self.boots.get(host, 0) + 1
        names = [f"gpu{i}" for i in range(n)]
        in_flight = {j for j in self._jobs_in(*ACTIVE) if self.worker_of[j] == wid(host)}
        reg = self.store.devices.register(
            host, f"boot-{self.boots[host]}", list(zip(names, ceilings, strict=False))
        )
        assert set(reg.reaped) == in_flight
        if reg.reaped:
            event("registration reaped jobs")
        for job_id in reg.reaped:
            self._finish(job_id, "lost")
        facts = {name: {"kind": "ab"[i % 2], "idx": str(i)} for i, name in enumerate(names)}
        self.store.devices.apply_facts(host, names, facts, None, None, None)
        for name, f in facts.items():
            self.labels[f"{host}:{name}"] = f

    @rule(data=st.data(), n=st.integers(1, 3))
    def submit(self, data: st.DataObject, n: int) -> None:
        for _ in range(n):  # several at once: same-second ties are the FIFO case (STORE-186)
            self._submit_one(data)

    def _submit_one(self, data: st.DataObject) -> None:
        how = data.draw(st.sampled_from(["pinned", "pinned", "selector", "any"]))
        priority = data.draw(st.integers(-1, 1))
        runtime = data.draw(st.sampled_from([0, 0, 300, 1200]))
        key = data.draw(st.sampled_from(["", "", "", "k1", "k2"]))
        hold = data.draw(st.integers(0, 5)) == 0  # a hold: its lease keeps its TTL (STORE-105)
        device = selector = ""
        if how == "pinned":
            device = data.draw(st.sampled_from(sorted(self.labels)))
        elif how == "selector":
            selector = data.draw(st.sampled_from(SELECTORS))
        req = NewJob(
            command=["hold"] if hold else ["run"],
            submitter="alice",
            device_id=device,
            selector=selector,
            priority=priority,
            max_runtime_seconds=(runtime or 300) if hold else runtime,
            idempotency_key=key,
            kind="hold" if hold else "job",
        )
        before = len(self.expected)
        try:
            job = self.store.queue.enqueue(req)
        except (errors.NoMatchingDevice, errors.RuntimeAboveCeiling):
            assert len(self.store.views.list_jobs(limit=200)) == before  # nothing written
            return
        except errors.UnknownDevice:
            assert store_helpers.device(self.store, device) is None  # pinned to a retired device
            assert len(self.store.views.list_jobs(limit=200)) == before
            return
        if key in self.keys:  # STORE-056 step 3: the same job back, unchanged
            assert job.id == self.keys[key]
            assert job.state == self.expected[job.id]
            return
        assert job.state == "queued" and job.id not in self.expected
        self.expected[job.id] = "queued"
        self.spec[job.id] = (device, job.selector, job.max_runtime_seconds)
        if key:
            self.keys[key] = job.id

    @rule()
    def schedule(self) -> None:
        self._may("assign")
        placed = self.store.queue.run_pass().assigned
        event(f"pass placed {len(placed)}")
        for a in placed:
            assert self.expected[a.job_id] == "queued"
            self.expected[a.job_id] = "assigned"
            self.worker_of[a.job_id] = a.worker_id
        devices = {d.id: d for d in store_helpers.devices(self.store)}
        queued = {j.id: j for j in self.store.views.queued()}

        def order(job_id: str) -> tuple[int, int, int]:
            j = self.store.views.job(job_id)
            return (-j.priority, j.queued_at, j.seq)

        for a in placed:
            # STORE-186 / STORE-060: a pinned job never overtakes a still-queued pinned
            # job for the same device that is ahead of it in scheduling order.
            pinned_to = self.spec[a.job_id][0]
            if pinned_to:
                for other in queued.values():
                    if other.device_id == pinned_to and other.selector == "":
                        assert order(other.id) > order(a.job_id), (other.id, a.job_id)
        # STORE-061: after a pass nothing queued can run on a ready device it may use.
        for job in queued.values():
            device, selector, runtime = self.spec[job.id]
            if device:
                candidates = [device]
            else:
                parsed = selectors.parse(selector) if selector else None
                candidates = [
                    d.id
                    for d in devices.values()
                    if (parsed is None or parsed.matches(self.labels.get(d.id, {})))
                    and (
                        runtime == 0
                        or d.max_runtime_seconds == 0
                        or d.max_runtime_seconds >= runtime
                    )
                ]
            for d in candidates:
                assert d not in devices or devices[d].state != "ready", (job.id, d)

    @rule()
    def tick(self) -> None:
        """A pass followed by every worker's poll: the common path from queued to running."""
        self.schedule()
        for host in HOSTS:
            self.take_work(host)

    @rule(host=st.sampled_from(HOSTS))
    def take_work(self, host: str) -> None:
        mine_assigned = {j for j in self._jobs_in("assigned") if self.worker_of[j] == wid(host)}
        handed, kills = self.store.reports.take_work(wid(host))
        assert {j.id for j in handed} == mine_assigned  # STORE-080: each handed out once
        for j in handed:
            self.expected[j.id] = "running"
        for job_id in kills:
            j = self.store.views.job(job_id)
            assert j.worker_id == wid(host) and j.kill_requested == 1
            assert j.state in ("assigned", "running", "killed")

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), state=st.sampled_from(TERMINAL), code=st.sampled_from([None, 0, 1]))
    def release(self, data: st.DataObject, state: str, code: int | None) -> None:
        self._may("release")
        job_id = self._pick(data, *ACTIVE)
        model = self.expected[job_id]
        if model == "queued":
            try:
                store_helpers.release(self.store, job_id, state, code, "r")
            except errors.InvalidTransition:
                return
            raise AssertionError("STORE-083: a queued job must not be released")
        out = store_helpers.release(self.store, job_id, state, code, "r")
        assert out.was_terminal == (model in TERMINAL)
        event(f"release of a {model} job")
        if model in ACTIVE:
            self._finish(job_id, state)

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), finalize=st.booleans())
    def request_kill(self, data: st.DataObject, finalize: bool) -> None:
        job_id = self._pick(data, *ACTIVE)
        model = self.expected[job_id]
        disconnected = False
        if model in ACTIVE:
            dev_state, reason = self._device_state(self.store.views.job(job_id).device_id)
            disconnected = dev_state == "unknown" or (
                dev_state == "unhealthy" and reason == "worker_lost"
            )
        outcome = self.store.queue.request_kill(job_id, "killed by alice", finalize)
        if model not in ACTIVE:
            assert outcome == "not_cancellable"  # STORE-091
        elif finalize and disconnected:
            assert outcome == "finalized"  # STORE-092
            self._finish(job_id, "killed")
            event("kill finalized")
        else:
            assert outcome == "requested"  # STORE-093
            assert self.store.views.job(job_id).kill_requested == 1

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        job_id = self._pick(data, "queued")
        was_queued = self.expected[job_id] == "queued"
        assert self.store.queue.cancel(job_id, "killed by alice") is was_queued  # STORE-090
        if was_queued:
            self._finish(job_id, "killed")

    @rule(host=st.sampled_from(HOSTS), data=st.data(), retain=st.booleans())
    def heartbeat(self, host: str, data: st.DataObject, retain: bool) -> None:
        self._may(*HEARTBEAT)
        ids = st.sampled_from([*self.expected, "bogus"])
        named = data.draw(st.lists(ids, max_size=4))
        pending = data.draw(st.lists(ids, max_size=2))  # EXT-OUTBOX-2: counts as named
        self.store.reports.heartbeat(wid(host), named, retain, pending=pending)
        now = self.store.now()
        renewed = {
            j
            for j in named + pending
            if self.expected.get(j) in ACTIVE and self.worker_of[j] == wid(host)
        }
        for lease in store_helpers.live_leases(self.store):
            if lease.job_id in renewed:
                assert lease.expires_at == now + 900  # STORE-096 step 2a

    @rule(
        data=st.data(),
        what=st.sampled_from(["fault", "clear", "clear", "unknown", "worker_lost"]),
    )
    def device_event(self, data: st.DataObject, what: str) -> None:
        device = data.draw(st.sampled_from(sorted(self.labels)))
        # The direct writes below stand in for the sweep's demotions.
        self._may("fault report", "operator clear", *SWEEP[:2])
        if store_helpers.device(self.store, device) is None:  # retired
            if what == "fault":
                try:
                    self.store.devices.set_state(device, "unhealthy", "verify failed")
                except errors.DeviceNotFound:
                    return
                raise AssertionError("STORE-131: a fault on no row must be DeviceNotFound")
            if what == "clear":
                assert self.store.devices.clear(device) is False
            return
        state, _ = self._device_state(device)
        if what == "fault":  # the host's own report (STORE-131)
            self.store.devices.set_state(device, "unhealthy", "verify failed")
            assert self._device_state(device) == ("unhealthy", "fault")
            self.faulted.add(device)
        elif what == "clear":  # STORE-130
            leased = any(x.device_id == device for x in store_helpers.live_leases(self.store))
            cleared = self.store.devices.clear(device)
            assert cleared is (state == "unhealthy" and not leased)
            if cleared:
                self.faulted.discard(device)
        # What the sweep would write (STORE-101), jobs untouched as in retention mode.
        elif what == "unknown" and state in ("ready", "busy"):
            self.raw.force_device(device, "unknown")
        elif what == "worker_lost" and state != "unhealthy":
            self.raw.force_device(device, "unhealthy", "worker_lost")

    @precondition(lambda self: self._jobs_in(*ACTIVE))
    @rule(data=st.data(), what=st.sampled_from(["fault", "unknown", "worker_lost"]))
    def device_event_in_flight(self, data: st.DataObject, what: str) -> None:
        """The device events again, aimed at a device with work in flight.

        A verify pass failing under a running job, or a worker going quiet: the release
        and heartbeat paths from there are where a device could wrongly return to the pool.
        """
        self._may("fault report", *SWEEP[:2])
        job_id = data.draw(st.sampled_from(self._jobs_in(*ACTIVE)))
        device = self.store.views.job(job_id).device_id
        if store_helpers.device(self.store, device) is None:
            return
        state, _ = self._device_state(device)
        if what == "fault":
            self.store.devices.set_state(device, "unhealthy", "verify failed")
            self.faulted.add(device)
            event("fault under a running job")
            if data.draw(st.booleans()):  # and the worker reports the job's end (STORE-082)
                self._may("release")
                store_helpers.release(self.store, job_id, "failed", 1, "verify failed")
                self._finish(job_id, "failed")
        elif what == "unknown" and state in ("ready", "busy"):
            self.raw.force_device(device, "unknown")
        elif what == "worker_lost" and state != "unhealthy":
            self.raw.force_device(device, "unhealthy", "worker_lost")

    @rule(seconds=st.sampled_from([0, 1, 29, 31, 400]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(
        host=st.sampled_from([*HOSTS, "nobody"]),
        seconds=st.sampled_from([31, 299, 300, 901]),
        data=st.data(),
    )
    def silence(self, host: str, seconds: int, data: st.DataObject) -> None:
        """The clock jumps and only ``host`` stays silent (maybe nobody): the others report.

        A reporting worker names only some of its jobs, so the others' leases lapse
        while their worker is plainly alive (the lease-expiry path, not the write-off).
        """
        self.clock.advance(seconds)
        self._may(*HEARTBEAT)
        for other in HOSTS:
            if other != host and other in self.boots:
                mine = [j for j in self._jobs_in(*ACTIVE) if self.worker_of[j] == wid(other)]
                named = [j for j in mine if data.draw(st.booleans())]
                self.store.reports.heartbeat(wid(other), named)

    @precondition(lambda self: self._jobs_in(*ACTIVE))
    @rule(seconds=st.sampled_from([300, 901]), retain=st.booleans(), data=st.data())
    def lapse(self, seconds: int, retain: bool, data: st.DataObject) -> None:
        """Work in flight, every worker reporting, some jobs left unnamed, then a sweep.

        The unnamed jobs' leases lapse while their workers are plainly alive: the
        lease-expiry path (STORE-103), not the write-off.
        """
        self.silence("nobody", seconds, data)
        self._sweep(retain, "judging", 0)

    @rule(retain=st.booleans(), window=WINDOWS, jump=JUMPS)
    def sweep(self, retain: bool, window: str, jump: int) -> None:
        self._sweep(retain, window, jump)

    @precondition(lambda self: self._jobs_in(*ACTIVE))
    @rule(retain=st.booleans(), window=WINDOWS, jump=JUMPS)
    def sweep_while_busy(self, retain: bool, window: str, jump: int) -> None:
        """The same rule again, enabled only with work in flight: that is where it bites."""
        self._sweep(retain, window, jump)

    def _sweep(self, retain: bool, window: str, jump: int) -> None:
        """One sweep (STORE-100..105) after ``jump`` seconds of nobody reporting.

        Its verdicts are predicted from the rows read first.
        """
        self.clock.advance(jump)
        self._may(*SWEEP)
        now = self.store.now()
        rules = {
            "judging": SweepRules(retain=retain),
            "at_hold_off": SweepRules(retain=retain, hold_off_until=now),
            "past_hold_off": SweepRules(retain=retain, hold_off_until=now - 100),
            "inside": SweepRules(retain=retain, hold_off_until=now + 30),
            "stalled": SweepRules(retain=retain, stalled=True),
        }[window]
        judging = window not in ("inside", "stalled")
        heard = {r["id"]: r["last_heartbeat_at"] for r in self.raw.rows("SELECT * FROM workers")}
        before = {d.id: d for d in store_helpers.devices(self.store)}
        live = store_helpers.live_leases(self.store)
        on_device = {
            r["id"]: r["device_id"]
            for r in self.raw.rows("SELECT id, device_id FROM jobs")
            if self.expected[r["id"]] in ACTIVE
        }
        unknown: set[str] = set()
        unhealthy: set[str] = set()
        reap: set[str] = set()
        for d in before.values():
            if d.worker_id not in heard:
                continue
            quiet = now - heard[d.worker_id]
            if judging and quiet >= UNHEALTHY_AFTER:
                reap.add(d.id)
                if d.state != "unhealthy":
                    unhealthy.add(d.id)
            elif quiet >= GRACE and d.state in ("ready", "busy"):
                unknown.add(d.id)
        lost = set() if retain else {j for j, d in on_device.items() if d in reap}
        expired = {
            x.job_id: x.device_id
            for x in live
            if judging
            and x.job_id not in lost
            and x.expires_at <= now
            and not (retain and x.kind == "job")
        }
        result = self.store.devices.sweep(rules)
        assert result.judging is judging
        assert set(result.devices_unknown) == unknown
        assert set(result.devices_unhealthy) == unhealthy
        assert set(result.jobs_lost) == lost
        assert set(result.leases_expired) == set(expired)
        for job_id in lost:
            self._finish(job_id, "lost", "worker lost")
        for job_id in expired:
            self._finish(job_id, "lost", "lease expired")
        event(f"sweep: judging={judging} lost={len(lost)} expired={len(expired)}")
        after = {d.id: d for d in store_helpers.devices(self.store)}
        assert after.keys() == before.keys()
        for device_id, was in before.items():
            now_is = after[device_id]
            # STORE-183: no sweep moves a device to ready.
            assert now_is.state != "ready" or was.state == "ready", (device_id, was.state)
            want = (was.state, was.quarantine_reason, was.quarantine_detail)
            if device_id in unknown:
                want = ("unknown", "", "")
            if device_id in unhealthy:
                want = ("unhealthy", "worker_lost", "")
            if device_id in expired.values() and want[0] != "unhealthy":
                want = ("unhealthy", "lease_expired", "")
            # STORE-031: an unhealthy device keeps its reason and detail through any sweep.
            got = (now_is.state, now_is.quarantine_reason, now_is.quarantine_detail)
            assert got == want, (device_id, got, want)

    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        """STORE-133: refused while leased; the device returns when its worker re-registers."""
        self._may("retire")
        device = data.draw(st.sampled_from(sorted(self.labels)))
        existed = store_helpers.device(self.store, device) is not None
        leased = any(x.device_id == device for x in store_helpers.live_leases(self.store))
        try:
            self.store.devices.retire(device)
        except errors.DeviceNotFound:
            assert not existed
            return
        except errors.DeviceBusy:
            assert existed and leased
            return
        assert existed and not leased
        assert store_helpers.device(self.store, device) is None
        self.faulted.discard(device)
        event("retired a device")

    @rule(host=st.sampled_from(HOSTS), proof=st.sampled_from(PROOFS))
    def auto_recover(self, host: str, proof: Proof) -> None:
        """STORE-121/122: the model picks the candidates and applies the flap guard itself."""
        self._may("auto-recovery")
        now = self.store.now()
        leased = {x.device_id for x in store_helpers.live_leases(self.store)}
        want: list[tuple[str, str]] = []
        held: list[str] = []
        if proof.isolated or (proof.survivors_checked and not proof.survivors_found):
            for d in store_helpers.devices(self.store):  # ordered by ID
                if (
                    d.worker_id == wid(host)
                    and d.state == "unhealthy"
                    and d.quarantine_reason in RECOVERABLE
                    and d.id not in leased
                ):
                    recent = [a for a in self.recovered_at.get(d.id, []) if a >= now - FLAP_WINDOW]
                    if len(recent) >= FLAP_LIMIT:
                        held.append(d.id)
                    else:
                        want.append((d.id, d.quarantine_reason))
        out = self.store.devices.auto_recover(wid(host), proof)
        assert [(r.device_id, r.reason) for r in out.recovered] == want
        assert out.held_back == held
        for device, _ in want:
            assert self._device_state(device) == ("ready", "")
            self.recovered_at.setdefault(device, []).append(now)
        if held:
            event("flap guard held a device back")
        if want:
            event("auto-recovered a device")

    # ---- invariants ----------------------------------------------------------------------

    @invariant()
    def database_invariants(self) -> None:
        assert invariant_violations(self.raw) == []  # STORE-180..182

    @invariant()
    def device_moves_are_legal(self) -> None:
        """STORE-021/022: what each device went through this step is a path of legal edges."""
        now_is = {r["id"]: r["state"] for r in self.raw.rows("SELECT id, state FROM devices")}
        for device in sorted(set(now_is) | set(self.device_seen)):
            was, got = self.device_seen.get(device), now_is.get(device)
            if was != got:
                event(f"device {was} -> {got}")
                assert got in reachable(self.step_ops, was), (device, was, got, self.step_ops)
        self.device_seen = now_is
        self.step_ops = set()

    @invariant()
    def faults_leave_only_by_clear(self) -> None:
        # STORE-184: sweeps, heartbeats, registrations and proofs never lift a fault.
        for device in self.faulted:
            assert self._device_state(device) == ("unhealthy", "fault"), device

    @invariant()
    def jobs_match_the_model(self) -> None:
        # One read of every row: a store read per finished job made each step cost O(jobs).
        rows = self.raw.rows("SELECT id, state, exit_code, kill_reason, finished_at FROM jobs")
        assert {r["id"]: r["state"] for r in rows} == self.expected
        stored = {r["id"]: tuple(r)[1:] for r in rows}
        for job_id, fields in self.finished.items():
            assert stored[job_id] == fields  # STORE-185


StoreMachine.TestCase.settings = settings(
    # CI's size; bench/model.py runs the long one (RC_MODEL_EXAMPLES/RC_MODEL_STEPS here too).
    max_examples=int(os.environ.get("RC_MODEL_EXAMPLES", "100")),
    stateful_step_count=int(os.environ.get("RC_MODEL_STEPS", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
TestStoreMachine = StoreMachine.TestCase
# CPU-bound with no wait in it (about 35 s of CPU for 100 x 50): on two cores shared
# with a loaded suite it ran past the suite's 120 s hang guard, which is meant for
# hangs, not for work that merely shares the machine.
TestStoreMachine.pytestmark = [pytest.mark.timeout(900)]  # type: ignore[attr-defined]
