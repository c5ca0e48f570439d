"""Several stores on one database driven step by step, as several controllers are, with
the invariants checked against the database after every step (EXT-PG-7).

A run is a list of ``Step``s (hypothesis chooses them: ``steps()``). Each step runs one
store operation to its end, or runs it with a fault injected at the n-th crash point it
reaches (the transaction rolls back, or it committed and its caller never heard), or
runs two operations of two stores at once: the first pauses at its first
``before_commit`` point, inside its open transaction, while the second runs (and may
block on what the first holds), then the first goes on. Crash points are
``resource_controller.crashpoints``' names, reached through ``Store.tx``.

After every step ``World.check`` reads the database on a connection of its own and
lists every breach: two live leases on a device, a grant on a device that was draining,
held, retired or out of the pool when the step began (unless the step itself put it
back), a grant to a job still waiting for another, a submitter over its limit, a job
both queued and holding a device, an ended lease whose device stayed busy, a job handed
out twice, and any acknowledged change lost (a submitted job gone, an end that changed,
a drain forgotten, a lease epoch reused).
"""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from resource_controller import crashpoints, errors
from resource_controller.clock import FakeClock
from resource_controller.core import expiry, share
from resource_controller.core.states import ACTIVE, TERMINAL, JobState, Kind
from resource_controller.store import sql
from resource_controller.store.devices import worker_id_for
from resource_controller.store.facade import Store
from resource_controller.store.jobs import KillOutcome, NewJob
from store.dbview import Raw, invariant_violations

#: Two hosts: plain GPUs, and a GPU declared whole beside two of its MIG instances.
HOSTS: dict[str, tuple[str, ...]] = {
    "a": ("gpu0", "gpu1"),
    "b": ("gpu0", "gpu0.mig0", "gpu0.mig1"),
}
DEVICES = tuple(f"{h}:{n}" for h, names in HOSTS.items() for n in names)
SUBMITTERS = ("ann", "bob")
LIMIT = 2  #: every submitter's limit of devices held at once
PAUSE_WAIT = 0.1  #: how long a paused step waits for the other operation to end
JOIN = 30.0  #: how long any operation may take before the run calls it hung

KINDS = (
    "submit",
    "pass",
    "handout",
    "running",
    "report",
    "kill",
    "drain",
    "undrain",
    "retire",
    "register",
    "heartbeat",
    "fault",
    "clear",
    "sweep",
    "tick",
)
#: Operations that can put a device back in the pool, and so make a grant on it in the
#: same step legitimate.
ENABLERS = {"undrain", "clear", "heartbeat", "register"}


class Injected(BaseException):
    """A fault injected at a crash point: everything the operation had open unwinds."""


@dataclass(frozen=True)
class Op:
    kind: str
    store: int = 0  #: which store runs it (modulo their number)
    pick: int = 0  #: which device, job or host it names (modulo the candidates)
    variant: int = 0  #: a choice of the kind's own (shape, outcome, duration)


@dataclass(frozen=True)
class Step:
    op: Op
    #: Fault the ``fault_at``-th crash point of ``fault_phase`` the operation reaches.
    fault_at: int = 0
    fault_phase: str = ".before_commit"
    #: Run this at the same time, while ``op`` waits at its first ``before_commit``.
    together: Op | None = None


#: How often each kind is drawn: the queue's own operations most.
WEIGHTS = {"submit": 6, "pass": 2, "handout": 3, "running": 2, "report": 4, "kill": 2, "drain": 2}


def ops() -> st.SearchStrategy[Op]:
    drawn = [k for k in KINDS for _ in range(WEIGHTS.get(k, 1))]
    return st.builds(
        Op,
        kind=st.sampled_from(drawn),
        store=st.integers(0, 2),
        pick=st.integers(0, 7),
        variant=st.integers(0, 5),
    )


#: What a step run together with another pauses first: an operation of the queue,
#: whose transaction reads the fleet and the queue and writes grants.
QUEUE_OPS = ("submit", "pass", "report", "kill", "handout")
#: What runs beside it most often: a change to a device the pass may be reading.
DEVICE_OPS = ("drain", "undrain", "fault", "clear", "retire", "register", "heartbeat")


@st.composite
def steps(draw: st.DrawFn) -> Step:
    op = draw(ops())
    shape = draw(st.sampled_from(("plain", "plain", "fault", "together", "together")))
    if shape == "fault":
        phase = draw(st.sampled_from((".before_commit", ".after_commit")))
        return Step(op, fault_at=draw(st.integers(1, 3)), fault_phase=phase)
    if shape == "together":
        first = Op(draw(st.sampled_from(QUEUE_OPS)), op.store, op.pick, op.variant)
        other = draw(ops())
        if draw(st.booleans()):
            other = Op(draw(st.sampled_from(DEVICE_OPS)), other.store, other.pick, other.variant)
        return Step(first, together=other, fault_at=draw(st.sampled_from((0, 1))))
    return Step(op)


@dataclass
class _Plan:
    """What the crash-point hook does on one thread."""

    fault_at: int = 0
    fault_phase: str = ".before_commit"
    pause: bool = False
    arrived: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    seen: int = 0
    fired: str = ""
    #: Once rolled back, wait for this (the other operation's end): what the store does
    #: after a rollback then races with the other's commit, as it may across processes.
    after_rollback: threading.Event | None = None
    #: Set when the operation ended, however.
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class Tally:
    """What a run did, for the bench's figures."""

    steps: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    together: int = 0
    blocked: int = 0  #: together-steps whose second operation waited on the first
    grants: int = 0
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    acknowledged: int = 0

    def add(self, other: Tally) -> None:
        self.steps += other.steps
        self.faults.update(other.faults)
        self.together += other.together
        self.blocked += other.blocked
        self.grants += other.grants
        self.refused.update(other.refused)
        self.acknowledged += other.acknowledged


@dataclass
class _Before:
    """The database as a step began: what a grant during the step is judged against."""

    devices: dict[str, tuple[str, int]]  #: id -> (state, draining)
    live: dict[str, str]  #: device -> job holding it
    leases: set[str]


class World:
    """``n`` stores on the database at ``database``, their shared clock, and a model of
    what they acknowledged."""

    def __init__(self, database: Path | str, n: int = 2) -> None:
        self.clock = FakeClock()
        self.stores = [Store(database, self.clock) for _ in range(n)]
        limits = share.SubmitterLimits(default=LIMIT)
        for s in self.stores:
            s.limits = limits
        self.raw = Raw(database)
        self.tally = Tally()
        self._local = threading.local()
        self._jobs: list[str] = []  #: every job a submit acknowledged, in order
        self._ended: dict[str, str] = {}  #: job -> the end it was seen or acknowledged in
        self._handed: set[str] = set()
        self._draining: dict[str, bool] = {}  #: acknowledged drain flags
        self._retired: set[str] = set()
        self._epochs: dict[str, int] = {}  #: lease -> its epoch, once seen
        for host in HOSTS:
            self._register(self.stores[0], host, "boot-1")

    def close(self) -> None:
        for s in self.stores:
            s.close()
        self.raw.close()

    # ---- the crash-point hook ----------------------------------------------------------

    @contextmanager
    def hooked(self) -> Iterator[None]:
        """Route every crash point through this world while the block runs."""
        real, rollback = crashpoints.hit, sql.Db.rollback
        local = self._local

        def rolled_back(db: sql.Db) -> None:
            rollback(db)
            plan: _Plan | None = getattr(local, "plan", None)
            if plan is not None and plan.after_rollback is not None:
                plan.after_rollback.wait(JOIN)

        crashpoints.hit = self._hit
        setattr(sql.Db, "rollback", rolled_back)  # noqa: B010 (a test hook on the class)
        try:
            yield
        finally:
            crashpoints.hit = real
            setattr(sql.Db, "rollback", rollback)  # noqa: B010

    def _hit(self, point: str, phase: str = "") -> None:
        plan: _Plan | None = getattr(self._local, "plan", None)
        if plan is None:
            return
        if plan.pause and phase == ".before_commit":
            plan.pause = False
            plan.arrived.set()
            plan.go.wait(JOIN)
        if plan.fault_at and phase == plan.fault_phase:
            plan.seen += 1
            if plan.seen == plan.fault_at:
                plan.fired = point + phase
                raise Injected(plan.fired)

    def _call(self, op: Op, plan: _Plan, out: list[BaseException | None]) -> None:
        self._local.plan = plan
        try:
            self._run(op)
            out.append(None)
        except BaseException as exc:  # the step's verdict, not the thread's crash
            out.append(exc)
        finally:
            self._local.plan = None
            plan.arrived.set()
            plan.ended.set()

    # ---- a step ------------------------------------------------------------------------

    def step(self, step: Step) -> list[str]:
        """Run ``step``; every breach the database shows after it."""
        self.tally.steps += 1
        before = self._before()
        first = _Plan(step.fault_at, step.fault_phase, pause=step.together is not None)
        out1: list[BaseException | None] = []
        t1 = threading.Thread(target=self._call, args=(step.op, first, out1))
        t1.start()
        kinds = {step.op.kind}
        if step.together is not None:
            self.tally.together += 1
            first.arrived.wait(JOIN)
            other = step.together
            if len(self.stores) > 1 and other.store % len(self.stores) == step.op.store % len(
                self.stores
            ):
                other = Op(other.kind, other.store + 1, other.pick, other.variant)
            out2: list[BaseException | None] = []
            second = _Plan()
            first.after_rollback = second.ended
            t2 = threading.Thread(target=self._call, args=(other, second, out2))
            t2.start()
            t2.join(PAUSE_WAIT)
            if t2.is_alive():
                self.tally.blocked += 1
            first.go.set()
            t2.join(JOIN)
            kinds.add(other.kind)
            if t2.is_alive():
                return [f"hung: {other} did not end within {JOIN} s beside {step.op}"]
            self._verdict(other, out2[0])
        t1.join(JOIN)
        if t1.is_alive():
            first.go.set()
            return [f"hung: {step.op} did not end within {JOIN} s"]
        if first.fired:
            self.tally.faults[first.fired] += 1
        self._verdict(step.op, out1[0])
        return self.check(before, kinds)

    def _verdict(self, op: Op, exc: BaseException | None) -> None:
        if exc is None:
            self.tally.acknowledged += 1
            return
        # Not acknowledged: it may or may not have taken effect (a fault after its
        # commit), so the model holds nothing about what it touched.
        if op.kind in ("drain", "undrain", "retire"):
            self._draining.pop(self._device(op), None)
            self._retired.discard(self._device(op))
        elif op.kind == "register":
            host = list(HOSTS)[op.pick % len(HOSTS)]
            self._retired -= {f"{host}:{n}" for n in HOSTS[host]}
        if isinstance(exc, errors.RcError) and not isinstance(exc, errors.StoreError):
            self.tally.refused[type(exc).__name__] += 1  # refused as the API would
        elif not isinstance(exc, Injected):
            raise exc

    # ---- the operations ----------------------------------------------------------------

    def _store(self, op: Op) -> Store:
        return self.stores[op.store % len(self.stores)]

    def _pick(self, items: list[str], op: Op) -> str | None:
        return items[op.pick % len(items)] if items else None

    def _job_rows(self, where: str = "") -> list[Any]:
        return self.raw.rows(f"SELECT id, state, worker_id FROM jobs {where} ORDER BY seq")

    def _run(self, op: Op) -> None:
        store = self._store(op)
        run: Callable[[Store, Op], None] = getattr(self, f"_op_{op.kind}")
        run(store, op)

    def _op_submit(self, store: Store, op: Op) -> None:
        device = DEVICES[op.pick % len(DEVICES)]
        submitter = SUBMITTERS[op.variant % 2]
        shape = op.variant % 6
        job = NewJob(command=["train"], submitter=submitter)
        if shape == 0:
            job = NewJob(["train"], submitter, device_id=device)
        elif shape == 2:
            job = NewJob(["train"], submitter, count=2)
        elif shape == 3:
            job = NewJob(["sleep"], submitter, device_id=device, kind=Kind.HOLD)
        elif shape == 4 and self._jobs:
            after = self._jobs[op.pick % len(self._jobs)]
            job = NewJob(["train"], submitter, after=(after,), after_any=op.pick % 2 == 1)
        elif shape == 5:
            job = NewJob(["train"], submitter, device_ids=tuple(DEVICES[:2]))
        made = store.queue.enqueue(job)
        self._jobs.append(made.id)
        store.queue.schedule_after(made)

    def _op_pass(self, store: Store, op: Op) -> None:
        store.queue.run_pass()

    def _op_handout(self, store: Store, op: Op) -> None:
        host = list(HOSTS)[op.pick % len(HOSTS)]
        handed, _ = store.reports.take_work(worker_id_for(host))
        for job in handed:
            if job.id in self._handed:
                raise AssertionError(f"job {job.id} handed out twice")
            self._handed.add(job.id)

    def _op_running(self, store: Store, op: Op) -> None:
        job = self._pick([r["id"] for r in self._job_rows("WHERE state = 'assigned'")], op)
        if job is not None:
            store.reports.status(job, _active, JobState.RUNNING)

    def _op_report(self, store: Store, op: Op) -> None:
        job = self._pick(
            [r["id"] for r in self._job_rows("WHERE state IN ('assigned', 'running')")], op
        )
        if job is None:
            return
        state = (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)[op.variant % 3]
        store.reports.status(job, _active, state, 0 if state == JobState.SUCCEEDED else 1)
        self._ended[job] = state

    def _op_kill(self, store: Store, op: Op) -> None:
        rows = self._job_rows("WHERE state IN ('queued', 'assigned', 'running')")
        row = rows[op.pick % len(rows)] if rows else None
        if row is None:
            return
        if row["state"] == JobState.QUEUED:
            if store.queue.cancel(row["id"], "killed by ann"):
                self._ended[row["id"]] = JobState.KILLED
            return
        outcome = store.queue.request_kill(row["id"], "killed by ann", op.variant % 2 == 1)
        if outcome is KillOutcome.FINALIZED:
            self._ended[row["id"]] = JobState.KILLED

    def _device(self, op: Op) -> str:
        return DEVICES[op.pick % len(DEVICES)]

    def _op_drain(self, store: Store, op: Op) -> None:
        store.devices.drain(self._device(op), "ops", "maintenance")
        self._draining[self._device(op)] = True

    def _op_undrain(self, store: Store, op: Op) -> None:
        store.devices.undrain(self._device(op))
        self._draining[self._device(op)] = False

    def _op_retire(self, store: Store, op: Op) -> None:
        store.devices.retire(self._device(op))
        self._retired.add(self._device(op))
        self._draining.pop(self._device(op), None)

    def _register(self, store: Store, host: str, boot: str) -> None:
        store.devices.register(host, boot, [(n, 0) for n in HOSTS[host]])
        for name in HOSTS[host]:
            self._retired.discard(f"{host}:{name}")

    def _op_register(self, store: Store, op: Op) -> None:
        host = list(HOSTS)[op.pick % len(HOSTS)]
        self._register(store, host, f"boot-{1 + op.variant % 2}")

    def _op_heartbeat(self, store: Store, op: Op) -> None:
        host = list(HOSTS)[op.pick % len(HOSTS)]
        worker = worker_id_for(host)
        running = [
            r["id"] for r in self._job_rows("WHERE state = 'running'") if r["worker_id"] == worker
        ]
        store.reports.heartbeat(worker, running)

    def _op_fault(self, store: Store, op: Op) -> None:
        store.devices.set_state(self._device(op), "unhealthy", "injected fault")

    def _op_clear(self, store: Store, op: Op) -> None:
        store.devices.clear(self._device(op))

    def _op_sweep(self, store: Store, op: Op) -> None:
        store.devices.sweep(expiry.SweepRules())

    def _op_tick(self, store: Store, op: Op) -> None:
        self.clock.advance((1, 20, 200, 2000)[op.variant % 4])

    # ---- the checks --------------------------------------------------------------------

    def _before(self) -> _Before:
        devices = {
            r["id"]: (r["state"], r["draining"])
            for r in self.raw.rows("SELECT id, state, draining FROM devices")
        }
        live = {
            r["device_id"]: r["job_id"]
            for r in self.raw.rows("SELECT device_id, job_id FROM leases WHERE released_at IS NULL")
        }
        leases = {r["id"] for r in self.raw.rows("SELECT id FROM leases")}
        return _Before(devices, live, leases)

    def check(self, before: _Before | None = None, kinds: set[str] | None = None) -> list[str]:
        """Every breach the database shows now; ``before`` and ``kinds`` (of the step's
        operations) judge the grants the step made."""
        bad = invariant_violations(self.raw)
        jobs = {
            r["id"]: r
            for r in self.raw.rows(
                "SELECT id, state, worker_id, after_ids, after_any, share_name, submitter FROM jobs"
            )
        }
        leases = self.raw.rows("SELECT id, device_id, job_id, epoch, released_at FROM leases")
        devices = {r["id"]: r for r in self.raw.rows("SELECT id, state, draining FROM devices")}
        live = [lease for lease in leases if lease["released_at"] is None]
        for lease in live:
            if lease["device_id"] not in devices:
                bad.append(f"live lease {lease['id']} of {lease['job_id']} on a retired device")
        # Acknowledged changes are never lost.
        for job_id in self._jobs:
            if job_id not in jobs:
                bad.append(f"lost: submitted job {job_id} is gone")
        for job_id, row in jobs.items():
            if row["state"] in TERMINAL:
                ended = self._ended.setdefault(job_id, row["state"])
                if ended != row["state"]:
                    bad.append(f"lost: job {job_id} ended {ended}, now {row['state']}")
            elif job_id in self._ended:
                bad.append(f"lost: job {job_id} ended {self._ended[job_id]}, now {row['state']}")
            if row["state"] == JobState.QUEUED and (
                row["worker_id"] or any(lease["job_id"] == job_id for lease in live)
            ):
                bad.append(f"job {job_id} is queued and holds a device")
        for device_id, draining in self._draining.items():
            row = devices.get(device_id)
            if row is not None and bool(row["draining"]) != draining:
                bad.append(
                    f"lost: device {device_id} drain flag {row['draining']}, acknowledged {draining}"
                )
        for device_id in self._retired:
            if device_id in devices:
                bad.append(f"lost: retired device {device_id} is back")
        for lease in leases:
            epoch = self._epochs.setdefault(lease["id"], lease["epoch"])
            if epoch != lease["epoch"]:
                bad.append(f"lease {lease['id']} changed its epoch")
        if len({lease["epoch"] for lease in leases}) != len(leases):
            bad.append("a lease epoch was given twice")
        # The submitter limit.
        held = collections.Counter(
            jobs[lease["job_id"]]["share_name"] or jobs[lease["job_id"]]["submitter"]
            for lease in live
            if lease["job_id"] in jobs
        )
        for name, n in held.items():
            if n > LIMIT:
                bad.append(f"{name} holds {n} devices, over its limit of {LIMIT}")
        recorded = {
            r["share_name"]: r["devices"]
            for r in self.raw.rows("SELECT share_name, devices FROM share_held")
        }
        if recorded != dict(held):
            bad.append(f"share_held says {recorded}, the live leases {dict(held)}")
        if before is not None:
            bad += self._judge_grants(before, kinds or set(), jobs, live)
        return bad

    def _judge_grants(
        self, before: _Before, kinds: set[str], jobs: dict[str, Any], live: list[Any]
    ) -> list[str]:
        bad: list[str] = []
        for lease in live:
            if lease["id"] in before.leases:
                continue
            self.tally.grants += 1
            device_id, job_id = lease["device_id"], lease["job_id"]
            job = jobs.get(job_id)
            was = before.devices.get(device_id)
            enabled = bool(kinds & ENABLERS)
            if was is None and "register" not in kinds:
                bad.append(f"grant of {device_id} to {job_id}: the device was retired")
            elif was is not None:
                state, draining = was
                if draining and "undrain" not in kinds:
                    bad.append(f"grant of {device_id} to {job_id}: the device was draining")
                if state in ("unknown", "unhealthy") and not enabled:
                    bad.append(f"grant of {device_id} to {job_id}: the device was {state}")
                holder = before.live.get(device_id)
                if (
                    holder is not None
                    and holder != job_id
                    and jobs.get(holder, {"state": ""})["state"] not in TERMINAL
                ):
                    bad.append(f"grant of {device_id} to {job_id}: held by {holder}")
            if job is not None and job["after_ids"]:
                for other in job["after_ids"].split(","):
                    ended = jobs.get(other, {"state": ""})["state"]
                    if ended not in TERMINAL or (
                        not job["after_any"] and ended != JobState.SUCCEEDED
                    ):
                        bad.append(
                            f"grant to {job_id} while the job it waits for, {other}, is {ended}"
                        )
        return bad


def _active(job: Any) -> None:
    """A worker's report is for a job it runs: refused once the job ended."""
    if job.state not in ACTIVE:
        raise errors.InvalidTransition(f"job {job.id} is {job.state}")


def run(database: Path | str, plan: list[Step], n: int = 2) -> tuple[list[str], Tally]:
    """Run ``plan`` on a fresh world; the first breach found (with the steps up to it),
    and the tally."""
    world = World(database, n)
    try:
        with world.hooked():
            for i, step in enumerate(plan):
                bad = world.step(step)
                if bad:
                    return [f"after step {i + 1} of {len(plan)} ({step}):", *bad], world.tally
        return [], world.tally
    finally:
        world.close()


def fresh_sqlite(directory: Path) -> Path:
    return directory / f"interleave-{uuid.uuid4().hex[:8]}.db"
