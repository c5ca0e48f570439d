"""The real Store driven by random operation sequences, checked against a small model.

After every step the database must satisfy the invariants of store.md §24 (STORE-180..182,
185, 186) and every job must be in the state the model predicts from the operations'
own answers. States that only the (not yet built) sweep produces are reached by the
``device_event`` rule writing the sweep's result directly, in retention-mode fashion
(devices demoted, jobs untouched; STORE-105). ``pytest --hypothesis-show-statistics``
lists the events below, i.e. how often the interesting paths were reached.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

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
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob

from .dbview import Raw, invariant_violations

HOSTS = ("h0", "h1")
SELECTORS = ("kind=a", "kind=b", "kind!=a", "idx>=1", "idx<=0,kind=a")
ACTIVE = ("assigned", "running")
TERMINAL = ("succeeded", "failed", "killed", "lost")


def wid(host: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, host))


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

    def _device_state(self, device_id: str) -> tuple[str, str]:
        d = self.store.device(device_id)
        assert d is not None
        return d.state, d.quarantine_reason

    def _finish(self, job_id: str, state: str) -> None:
        self.expected[job_id] = state
        j = self.store.job(job_id)
        assert j.state == state
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
        if reboot or host not in self.boots:
            self.boots[host] = self.boots.get(host, 0) + 1
        names = [f"gpu{i}" for i in range(n)]
        in_flight = {j for j in self._jobs_in(*ACTIVE) if self.worker_of[j] == wid(host)}
        reg = self.store.register(
            host, f"boot-{self.boots[host]}", list(zip(names, ceilings, strict=False))
        )
        assert set(reg.reaped) == in_flight
        if reg.reaped:
            event("registration reaped jobs")
        for job_id in reg.reaped:
            self._finish(job_id, "lost")
        facts = {name: {"kind": "ab"[i % 2], "idx": str(i)} for i, name in enumerate(names)}
        self.store.apply_facts(host, names, facts, None, None, None)
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
        device = selector = ""
        if how == "pinned":
            device = data.draw(st.sampled_from(sorted(self.labels)))
        elif how == "selector":
            selector = data.draw(st.sampled_from(SELECTORS))
        req = NewJob(
            command=["run"],
            submitter="alice",
            device_id=device,
            selector=selector,
            priority=priority,
            max_runtime=runtime,
            idempotency_key=key,
        )
        before = len(self.expected)
        try:
            job = self.store.enqueue(req)
        except (errors.NoMatchingDevice, errors.RuntimeAboveCeiling):
            assert len(self.store.list_jobs(limit=200)) == before  # nothing written
            return
        if key in self.keys:  # STORE-056 step 3: the same job back, unchanged
            assert job.id == self.keys[key]
            assert job.state == self.expected[job.id]
            return
        assert job.state == "queued" and job.id not in self.expected
        self.expected[job.id] = "queued"
        self.spec[job.id] = (device, job.selector, job.max_runtime)
        if key:
            self.keys[key] = job.id

    @rule()
    def schedule(self) -> None:
        placed = self.store.schedule()
        event(f"pass placed {len(placed)}")
        for a in placed:
            assert self.expected[a.job_id] == "queued"
            self.expected[a.job_id] = "assigned"
            self.worker_of[a.job_id] = a.worker_id
        devices = {d.id: d for d in self.store.devices()}
        queued = {j.id: j for j in self.store.queued_jobs()}

        def order(job_id: str) -> tuple[int, int, int]:
            j = self.store.job(job_id)
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
                    and (runtime == 0 or d.max_runtime == 0 or d.max_runtime >= runtime)
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
        handed, kills = self.store.take_work(wid(host))
        assert {j.id for j in handed} == mine_assigned  # STORE-080: each handed out once
        for j in handed:
            self.expected[j.id] = "running"
        for job_id in kills:
            j = self.store.job(job_id)
            assert j.worker_id == wid(host) and j.kill_requested == 1
            assert j.state in ("assigned", "running", "killed")

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), state=st.sampled_from(TERMINAL), code=st.sampled_from([None, 0, 1]))
    def release(self, data: st.DataObject, state: str, code: int | None) -> None:
        job_id = self._pick(data, *ACTIVE)
        model = self.expected[job_id]
        if model == "queued":
            try:
                self.store.release(job_id, state, code, "r")
            except errors.InvalidTransition:
                return
            raise AssertionError("STORE-083: a queued job must not be released")
        out = self.store.release(job_id, state, code, "r")
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
            dev_state, reason = self._device_state(self.store.job(job_id).device_id)
            disconnected = dev_state == "unknown" or (
                dev_state == "unhealthy" and reason == "worker_lost"
            )
        outcome = self.store.request_kill(job_id, "killed by alice", finalize)
        if model not in ACTIVE:
            assert outcome == "not_cancellable"  # STORE-091
        elif finalize and disconnected:
            assert outcome == "finalized"  # STORE-092
            self._finish(job_id, "killed")
            event("kill finalized")
        else:
            assert outcome == "requested"  # STORE-093
            assert self.store.job(job_id).kill_requested == 1

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        job_id = self._pick(data, "queued")
        was_queued = self.expected[job_id] == "queued"
        assert self.store.cancel_queued(job_id, "killed by alice") is was_queued  # STORE-090
        if was_queued:
            self._finish(job_id, "killed")

    @rule(host=st.sampled_from(HOSTS), data=st.data(), retain=st.booleans())
    def heartbeat(self, host: str, data: st.DataObject, retain: bool) -> None:
        named = data.draw(st.lists(st.sampled_from([*self.expected, "bogus"]), max_size=4))
        self.store.heartbeat(wid(host), named, retain)
        now = self.store.now()
        renewed = {
            j for j in named if self.expected.get(j) in ACTIVE and self.worker_of[j] == wid(host)
        }
        for lease in self.store.live_leases():
            if lease.job_id in renewed:
                assert lease.expires_at == now + 900  # STORE-096 step 2a

    @rule(
        data=st.data(),
        what=st.sampled_from(["fault", "clear", "clear", "unknown", "worker_lost"]),
    )
    def device_event(self, data: st.DataObject, what: str) -> None:
        device = data.draw(st.sampled_from(sorted(self.labels)))
        state, _ = self._device_state(device)
        if what == "fault":  # the host's own report (STORE-131)
            self.store.set_device_state(device, "unhealthy", "verify failed")
            assert self._device_state(device) == ("unhealthy", "fault")
        elif what == "clear":  # STORE-130
            leased = any(x.device_id == device for x in self.store.live_leases())
            assert self.store.clear_device(device) is (state == "unhealthy" and not leased)
        # What the sweep would write (STORE-101), jobs untouched as in retention mode.
        elif what == "unknown" and state in ("ready", "busy"):
            self.raw.force_device(device, "unknown")
        elif what == "worker_lost" and state != "unhealthy":
            self.raw.force_device(device, "unhealthy", "worker_lost")

    @rule(seconds=st.sampled_from([0, 1, 29, 31, 400]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # ---- invariants ----------------------------------------------------------------------

    @invariant()
    def database_invariants(self) -> None:
        assert invariant_violations(self.raw) == []  # STORE-180..182

    @invariant()
    def jobs_match_the_model(self) -> None:
        actual = {r["id"]: r["state"] for r in self.raw.rows("SELECT id, state FROM jobs")}
        assert actual == self.expected
        for job_id, fields in self.finished.items():
            j = self.store.job(job_id)
            assert (j.state, j.exit_code, j.kill_reason, j.finished_at) == fields  # STORE-185


StoreMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
TestStoreMachine = StoreMachine.TestCase
