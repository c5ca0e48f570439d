"""No wake-up is forgotten: each operation's returned ``Wake``, checked without HTTP.

EXT-FAST-1 lists the changes that must be followed by a scheduling pass; each is driven
here through ``controller/service.py`` against a real store and its returned wake-ups are
checked. A second test reads the source: the hub's wake methods are called only from
``wake.apply`` (and ``hub.py`` itself), so no route or loop can wake anything by hand.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from controller_harness import QUIET, START, TOKENS

import resource_controller
from resource_controller import wire
from resource_controller.clock import FakeClock
from resource_controller.controller import serve, service, workerops
from resource_controller.controller.deps import Services
from resource_controller.controller.wake import Done, Wake
from resource_controller.core import expiry
from resource_controller.core.identity import Caller
from resource_controller.core.states import DeviceState, JobState, Role
from support import store_helpers

T = TypeVar("T")

CLIENT = Caller(Role.CLIENT)
WORKER = Caller(Role.WORKER)
ADMIN = Caller(Role.ADMIN)
HOST = "gpubox"
DEV = f"{HOST}:gpu0"


class Ops:
    """A store-backed ``Services`` and helpers that run one operation and keep its ``Done``."""

    def __init__(self, svc: Services, clock: FakeClock) -> None:
        self.svc = svc
        self.clock = clock
        self.loop = asyncio.new_event_loop()

    def run(self, op: Callable[..., Awaitable[Done[T]]], *args: Any) -> Done[T]:
        return self.loop.run_until_complete(op(self.svc, *args))

    def register(self, **extra: Any) -> Done[Any]:
        req = wire.RegisterRequest(host=HOST, devices=[wire.DeviceDecl(name="gpu0")], **extra)
        return self.run(workerops.register, WORKER, req)

    def submit(self, **fields: Any) -> Done[Any]:
        fields.setdefault("command", ["true"])
        req = wire.SubmitRequest(device_id=DEV, submitter="alice", **fields)
        return self.run(service.submit, CLIENT, req)

    def take(self, worker_id: str) -> list[str]:
        gone: asyncio.Future[None] = self.loop.create_future()
        handed, _ = self.run(workerops.poll, worker_id, 0.01, gone).value
        return [j.id for j in handed]

    def report(self, job_id: str, worker_id: str, state: str) -> Done[None]:
        req = wire.StatusReport(worker_id=worker_id, state=state, exit_code=0)
        return self.run(workerops.report_status, job_id, req)

    def silence(self) -> Done[Any]:
        """Let the worker go quiet past the grace and sweep: its device goes ``unknown``."""
        self.clock.advance(expiry.GRACE + 1)
        return self.run(service.sweep, expiry.SweepRules(hold_off_until=None), None)

    def state_of(self, job_id: str) -> str:
        return self.svc.store.views.job(job_id).state

    def close(self) -> None:
        self.loop.close()
        self.svc.executor.shutdown(wait=True)
        self.svc.store.close()


def _ops(tmp_path: Path, retain: bool = False) -> Ops:
    clock = FakeClock(START)
    settings = dataclasses.replace(QUIET, retain_disconnected_jobs=retain)
    return Ops(serve.open_services(tmp_path / "data", TOKENS, settings, clock), clock)


@pytest.fixture
def ops(tmp_path: Path) -> Iterator[Ops]:
    o = _ops(tmp_path)
    try:
        yield o
    finally:
        o.close()


@pytest.fixture
def retaining(tmp_path: Path) -> Iterator[Ops]:
    o = _ops(tmp_path, retain=True)
    try:
        yield o
    finally:
        o.close()


# ---- EXT-FAST-1: every listed change is followed by a scheduling pass ---------------


def test_registration_schedules(ops: Ops) -> None:  # EXT-FAST-1: a worker's registration
    done = ops.register()
    assert done.wake.schedule and done.wake.devices


def test_submit_runs_its_pass_inline_and_wakes_the_worker(ops: Ops) -> None:  # EXT-FAST-1
    wid = ops.register().value.worker_id
    done = ops.submit()
    # API-042: the pass ran inside the submit (no second pass is kicked), and the worker
    # the pass assigned to is woken.
    assert done.wake.passes and done.wake.scheduled and not done.wake.schedule
    assert done.value.state == JobState.ASSIGNED
    assert done.wake.workers == {wid}


def test_terminal_status_report_schedules(ops: Ops) -> None:  # EXT-FAST-1
    wid = ops.register().value.worker_id
    job = ops.submit().value
    assert ops.take(wid) == [job.id]
    running = ops.report(job.id, wid, JobState.RUNNING)
    # Nothing placeable changed; only the stream hears of it (EVT-010).
    assert running.wake == Wake.job(job.id, JobState.RUNNING)
    done = ops.report(job.id, wid, JobState.SUCCEEDED)
    # The pass runs inside the report; nothing else is kicked.
    assert done.wake.passes and done.wake.scheduled and not done.wake.schedule
    assert done.wake.ended == {job.id}  # EXT-FAST-2 too


def test_the_report_s_pass_hands_the_device_on_and_wakes_its_worker(ops: Ops) -> None:
    # EXT-FAST-1, SRV-030: the release's pass assigned the queued job, so its worker's
    # long poll is woken and the stream hears of the pass (EVT-011).
    wid = ops.register().value.worker_id
    first = ops.submit().value
    second = ops.submit().value
    assert ops.take(wid) == [first.id]
    done = ops.report(first.id, wid, JobState.SUCCEEDED)
    assert done.wake.workers == {wid} and done.wake.assigned
    assert ops.take(wid) == [second.id]


def test_release_of_a_hold_schedules(ops: Ops) -> None:  # EXT-FAST-1: a release of a hold
    wid = ops.register().value.worker_id
    hold = ops.submit(kind="hold", command=None, max_runtime_seconds=600).value
    assert ops.take(wid) == [hold.id]
    kill = ops.run(service.kill, CLIENT, hold.id, wire.KillRequest(submitter="alice"))
    assert kill.wake.workers == {wid}  # the release is handed to the worker ...
    done = ops.report(hold.id, wid, JobState.KILLED)  # ... which ends the hold
    assert done.wake.passes and done.wake.ended == {hold.id}


def test_cancel_of_a_queued_job_schedules(ops: Ops) -> None:  # EXT-FAST-1: a cancel
    ops.register()
    ops.submit()
    queued = ops.submit().value
    assert queued.state == JobState.QUEUED
    done = ops.run(service.kill, CLIENT, queued.id, wire.KillRequest(submitter="alice"))
    assert done.wake.schedule and done.wake.ended == {queued.id}
    assert ops.state_of(queued.id) == JobState.KILLED


def test_kill_finalised_by_the_controller_schedules(retaining: Ops) -> None:  # EXT-FAST-1
    retaining.register()
    job = retaining.submit().value
    assert retaining.silence().value.devices_unknown == [DEV]
    done = retaining.run(service.kill, CLIENT, job.id, wire.KillRequest(submitter="alice"))
    assert retaining.state_of(job.id) == JobState.KILLED  # finalised here (STORE-092)
    assert done.wake.schedule and done.wake.ended == {job.id}


def test_kill_handed_to_the_worker_wakes_only_the_worker(ops: Ops) -> None:  # API-046
    wid = ops.register().value.worker_id
    job = ops.submit().value
    done = ops.run(service.kill, CLIENT, job.id, wire.KillRequest(submitter="alice"))
    assert done.wake == Wake(workers=frozenset({wid})) | Wake.job(job.id, "assigned")


def test_clear_schedules(ops: Ops) -> None:  # EXT-FAST-1: a device cleared
    ops.register()
    ops.run(workerops.fault, DEV, wire.FaultReport(reason="fan"))
    assert store_helpers.device(ops.svc.store, DEV).state == DeviceState.UNHEALTHY  # type: ignore[union-attr]
    done = ops.run(service.clear, DEV)
    assert done.wake.schedule and done.wake.devices


def test_device_back_from_unknown_schedules(ops: Ops) -> None:  # EXT-FAST-1
    wid = ops.register().value.worker_id
    swept = ops.silence()
    assert swept.value.devices_unknown == [DEV] and swept.wake.schedule
    done = ops.run(workerops.heartbeat, wid, wire.HeartbeatRequest())
    assert store_helpers.device(ops.svc.store, DEV).state == DeviceState.READY  # type: ignore[union-attr]
    assert done.wake.schedule


def test_a_routine_heartbeat_kicks_no_pass(ops: Ops) -> None:  # a fleet heartbeats often
    wid = ops.register().value.worker_id
    done = ops.run(workerops.heartbeat, wid, wire.HeartbeatRequest())
    assert done.wake == Wake()


def test_no_wait_refusal_ends_the_job_and_raises_after_commit(ops: Ops) -> None:  # API-042
    ops.register()
    ops.submit()
    done = ops.submit(no_wait=True)
    assert done.error is not None and done.error.code == "no_device_available"
    assert done.wake.ended == {done.value.id}
    assert ops.state_of(done.value.id) == JobState.KILLED


def test_facts_and_faults_change_devices_only(ops: Ops) -> None:  # EVT-012's triggers
    wid = ops.register().value.worker_id
    push = ops.run(workerops.push_labels, wid, wire.LabelsPush(host=HOST, devices=["gpu0"]))
    fault = ops.run(workerops.fault, DEV, wire.FaultReport(reason="fan"))
    assert push.wake == Wake(devices=True)
    # The fault also raises its webhook event (HOOKN-012a), nothing else.
    assert fault.wake == Wake(devices=True, notices=fault.wake.notices)
    assert [n.event for n in fault.wake.notices] == ["device_unhealthy"]


# ---- the only caller of the hub's wake methods is wake.apply ---------------------------

WAKE_METHODS = {"kick_scheduler", "job_changed", "wake", "wake_everyone", "wake_all"}


def _wake_calls(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(enclosing function, line) of every ``...hub...<wake method>(...)`` call."""

    def walk(node: ast.AST, func: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            name = func
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = child.name
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr in WAKE_METHODS
                and "hub" in ast.unparse(child.func.value)
            ):
                yield name, child.lineno
            yield from walk(child, name)

    yield from walk(tree, "<module>")


def test_hub_wakes_come_only_from_apply() -> None:
    src = Path(resource_controller.__file__).parent
    found: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel == "controller/hub.py":
            continue
        for func, line in _wake_calls(ast.parse(path.read_text(), str(path))):
            found.setdefault(f"{rel}:{func}", []).append(str(line))
    assert set(found) == {"controller/wake.py:apply"}, found


def test_the_grep_sees_a_hand_written_kick() -> None:
    code = "async def route(svc):\n    svc.hub.kick_scheduler()\n    svc.hub.workers.wake(w)\n"
    assert [f for f, _ in _wake_calls(ast.parse(code))] == ["route", "route"]
