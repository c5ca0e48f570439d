"""The outbox: reports written to disk first, retried until answered for good (EXT-OUTBOX).

First the store and the delivery rules on their own, then the agent against the fake
controller: durability before the first attempt, retries, definitive refusals, pending
jobs in heartbeats, a restart that re-sends before registering, and delivery before a
re-registration.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import worker_helpers
from fake_controller import (
    FakeController,
    Reply,
    Running,
    job,
    make_config,
    outbox_files,
    until,
)
from live_controller import LiveController, start_worker, submit
from worker_helpers import FAST, pids_with_job_prefix, run

from resource_controller.clock import FakeClock
from resource_controller.h1 import core
from resource_controller.h1.aio import Answer
from resource_controller.worker import delivery, outbox, process
from resource_controller.worker.timings import Timings

#: A shutdown that gives up on its job tasks quickly.
QUICK_SHUTDOWN = replace(FAST, shutdown_wait=0.3)


def answer(status: int, body: Any = None) -> Answer:
    """An answer as the worker's client returns it."""
    content = json.dumps(body).encode() if body is not None else b""
    return Answer(core.Head(status, "", {}), content)


def route(report: outbox.Report) -> str:
    """The route a report's kind names."""
    if report.kind == outbox.FAULT:
        return f"/v1/devices/{report.device_id}/fault"
    if report.kind == outbox.LOG:
        return f"/v1/jobs/{report.job_id}/logs"
    return f"/v1/jobs/{report.job_id}/status"


class Routes:
    """An ``delivery.Sender`` that hands each attempt to ``post(route, body, timeout)``."""

    def __init__(self, post: Callable[[str, dict[str, Any], float], Awaitable[Answer]]):
        self.post = post

    async def status(self, job_id: str, body: Mapping[str, Any], timeout: float) -> Answer:
        return await self.post(f"/v1/jobs/{job_id}/status", dict(body), timeout)

    async def fault(self, device_id: str, body: Mapping[str, Any], timeout: float) -> Answer:
        return await self.post(f"/v1/devices/{device_id}/fault", dict(body), timeout)

    async def append_log(
        self, job_id: str, chunk: bytes, lease_epoch: int | None, timeout: float | None = None
    ) -> Answer:
        body = {"chunk": chunk, "lease_epoch": lease_epoch}
        return await self.post(f"/v1/jobs/{job_id}/logs", body, timeout or 0.0)


# ---- the store -----------------------------------------------------------------


def test_open_creates_the_state_dir_private(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    state = tmp_path / "a" / "b"
    box = outbox.Outbox.open(str(state))
    try:
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert stat.S_IMODE((state / outbox.SUBDIR).stat().st_mode) == 0o700
    finally:
        box.close()
    state.chmod(0o755)  # an existing directory is the operator's: left as it is
    outbox.Outbox.open(str(state)).close()
    assert stat.S_IMODE(state.stat().st_mode) == 0o755


def test_open_fails_when_the_state_dir_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(outbox.OutboxError) as info:
        outbox.Outbox.open(str(tmp_path / "file" / "state"))
    assert str(info.value) == (f"state_dir: mkdir {tmp_path / 'file' / 'state'}: not a directory")


def test_one_worker_per_state_dir(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    first = outbox.Outbox.open(str(tmp_path))
    with pytest.raises(outbox.OutboxError) as info:
        outbox.Outbox.open(str(tmp_path))
    text = str(info.value)
    assert text.startswith(f"state_dir {tmp_path} is in use by another worker process")
    assert "different host names or each its own state_dir" in text
    first.close()
    outbox.Outbox.open(str(tmp_path)).close()


def test_reports_survive_in_files(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    async def write() -> None:
        box = outbox.Outbox.open(str(tmp_path))
        fault = box.add_fault("box:gpu0", "verify failed: x", "j1")
        status = box.add_status("j1", ["box:gpu0"], {"state": "killed", "worker_id": "w"})
        await box.persist(fault)
        await box.persist(status)
        box.close()

    run(write())
    files = sorted(p.name for p in (tmp_path / outbox.SUBDIR).iterdir())
    assert files == ["000000000001-fault.json", "000000000002-status.json"]
    record = json.loads((tmp_path / outbox.SUBDIR / files[1]).read_text())
    assert record["version"] == 1 and record["kind"] == "status"
    assert record["body"] == {"state": "killed", "worker_id": "w"}
    assert record["job_id"] == "j1" and record["device_ids"] == ["box:gpu0"]
    mode = (tmp_path / outbox.SUBDIR / files[1]).stat().st_mode
    assert stat.S_IMODE(mode) == 0o600
    # A report half-written when the process died, and a file that is not a report.
    (tmp_path / outbox.SUBDIR / ".000000000003-status.json.tmp").write_text("{")
    (tmp_path / outbox.SUBDIR / "000000000004-status.json").write_text("garbage")

    async def reload() -> list[outbox.Report]:
        box = outbox.Outbox.open(str(tmp_path))
        try:
            reports = box.reports()
            assert box.pending_job_ids() == ["j1"]
            assert box.predecessors(reports[1]) == [reports[0]]
            nxt = box.add_status("j2", ["box:gpu1"], {})
            assert nxt.seq == 5 and box.predecessors(nxt) == []
            return reports
        finally:
            box.close()

    fault, status = run(reload())
    assert (fault.kind, route(fault)) == ("fault", "/v1/devices/box:gpu0/fault")
    assert (status.kind, route(status)) == ("status", "/v1/jobs/j1/status")
    left = sorted(p.name for p in (tmp_path / outbox.SUBDIR).iterdir())
    assert left == [
        "000000000001-fault.json",
        "000000000002-status.json",
        "000000000004-status.json.bad",
    ]


@pytest.mark.parametrize(
    ("status", "body", "verdict"),
    [
        (200, None, delivery.Verdict.DELIVERED),
        (204, None, delivery.Verdict.DELIVERED),
        (404, {"error": "not_found", "message": "no such job"}, delivery.Verdict.REFUSED),
        (409, {"error": "stale_lease", "message": "old"}, delivery.Verdict.REFUSED),
        (409, {"error": "job_terminal", "message": "x"}, delivery.Verdict.REFUSED),
        (
            409,
            {"error": "conflict", "message": "job is already terminal"},
            delivery.Verdict.REFUSED,
        ),
        (409, {"error": "conflict", "message": "busy"}, delivery.Verdict.RETRY),
        (409, None, delivery.Verdict.RETRY),
        (403, {"error": "not_job_owner", "message": "x"}, delivery.Verdict.RETRY),
        (401, None, delivery.Verdict.RETRY),
        (400, None, delivery.Verdict.RETRY),
        (500, None, delivery.Verdict.RETRY),
        (503, None, delivery.Verdict.RETRY),
    ],
)
def test_judge(status: int, body: Any, verdict: delivery.Verdict) -> None:  # EXT-OUTBOX-1
    resp = answer(status, body)
    assert delivery.judge(resp) is verdict


def test_backoff_doubles_to_its_cap(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    timings = Timings(outbox_backoff=0.02, outbox_backoff_max=0.08)
    times: list[float] = []

    async def post(route: str, body: dict[str, Any], timeout: float) -> Answer:
        times.append(time.monotonic())
        return answer(200 if len(times) == 7 else 500)

    async def go() -> delivery.Verdict:
        box = outbox.Outbox.open(str(tmp_path))
        try:
            report = box.add_status("j", ["d"], {})
            await box.persist(report)
            return await delivery.deliver(box, report, Routes(post), timings)
        finally:
            box.close()

    assert run(go()) is delivery.Verdict.DELIVERED
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for gap, expected in zip(gaps, [0.02, 0.04, 0.08, 0.08, 0.08, 0.08], strict=True):
        assert expected * 0.9 <= gap < expected + 0.05
    assert list((tmp_path / outbox.SUBDIR).iterdir()) == []


def test_a_fault_lands_before_the_terminal_report_of_its_device(tmp_path: Path) -> None:
    # VERIFY-008, HOOK-012: the controller frees the device at the terminal report.
    order: list[str] = []
    fault_refusals = [500, 500, 500]

    async def post(route: str, body: dict[str, Any], timeout: float) -> Answer:
        if route.endswith("/fault") and fault_refusals:
            return answer(fault_refusals.pop())
        order.append(route)
        return answer(200)

    async def go() -> None:
        box = outbox.Outbox.open(str(tmp_path))
        try:
            fault = box.add_fault("h:gpu0", "verify failed: dirty", "j1")
            terminal = box.add_status("j1", ["h:gpu0"], {"state": "succeeded"})
            other = box.add_status("j2", ["h:gpu1"], {"state": "succeeded"})
            await asyncio.gather(
                *(delivery.deliver(box, r, Routes(post), FAST) for r in (terminal, other, fault))
            )
            assert box.empty
        finally:
            box.close()

    run(go())
    assert order == ["/v1/jobs/j2/status", "/v1/devices/h:gpu0/fault", "/v1/jobs/j1/status"]


def test_each_attempt_is_bounded(tmp_path: Path) -> None:
    timings = replace(FAST, report_attempt_timeout=0.05)
    calls: list[float] = []

    async def post(route: str, body: dict[str, Any], timeout: float) -> Answer:
        calls.append(time.monotonic())
        if len(calls) < 3:
            await asyncio.sleep(3600)  # a blackholed controller: no answer, ever
        return answer(200)

    async def go() -> None:
        box = outbox.Outbox.open(str(tmp_path))
        try:
            report = box.add_status("j", ["d"], {})
            verdict = await delivery.deliver(box, report, Routes(post), timings)
            assert verdict is delivery.Verdict.DELIVERED
        finally:
            box.close()

    began = time.monotonic()
    run(go())
    assert len(calls) == 3 and time.monotonic() - began < 1


# ---- in the agent ----------------------------------------------------------------


def records() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in outbox_files()]


def test_durable_before_the_first_attempt_and_pending_meanwhile() -> None:
    # EXT-OUTBOX-1, EXT-OUTBOX-2
    ctl = FakeController()
    ctl.reports_unreachable = True
    seen_on_disk: list[list[dict[str, Any]]] = []
    ctl.on_report = lambda request: seen_on_disk.append(records())
    a = job(["true"], lease_epoch=3)
    ctl.hand_out(a)
    jid = a["job_id"]

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: len(seen_on_disk) >= 3)  # attempts fail: nobody answers
        beats = len(ctl.heartbeats)
        await until(lambda: len(ctl.heartbeats) >= beats + 2)
        assert r.agent.pending_job_ids == [jid] and r.agent.supervised_job_ids == []
        ctl.reports_unreachable = False
        await until(lambda: bool(ctl.terminal(jid)) and not r.agent.pending_job_ids)
        beats = len(ctl.heartbeats)
        await until(lambda: len(ctl.heartbeats) >= beats + 2)
        await r.finish()

    run(go())
    # Every attempt, the first included, found the report already on disk.
    expected = {"state": "succeeded", "exit_code": 0, "worker_id": "w-1", "lease_epoch": 3}
    for on_disk in seen_on_disk:
        assert [(x["kind"], x["job_id"], x["body"]) for x in on_disk] == [("status", jid, expected)]
    assert ctl.terminal(jid) == [expected]
    assert outbox_files() == []
    named = [h for h in ctl.heartbeats if h]
    # Named as running, then as pending while its report waits, never both at once.
    assert {"pending_job_ids": [jid]} in named
    for h in named:
        assert not (set(h.get("running_job_ids", [])) & set(h.get("pending_job_ids", [])))
    assert ctl.heartbeats[-1] == {}


@pytest.mark.parametrize(
    "refusal",
    [
        Reply(404, json={"error": "not_found", "message": "no such job"}),
        Reply(409, json={"error": "stale_lease", "message": "lease epoch 3 is old"}),
        Reply(409, json={"error": "conflict", "message": "job is already terminal"}),
    ],
    ids=["404", "stale_lease", "terminal"],
)
def test_definitive_refusals_drop_the_report(refusal: Reply) -> None:  # EXT-OUTBOX-1
    ctl = FakeController()
    ctl.terminal_failures = [500, refusal]
    a = job(["true"])
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: len(ctl.terminal(a["job_id"])) == 2 and not r.agent.pending_job_ids)
        await asyncio.sleep(0.2)
        await r.finish()

    run(go())
    assert len(ctl.terminal(a["job_id"])) == 2  # refused for good: never sent again
    assert outbox_files() == []


def test_a_prekilled_report_goes_through_the_outbox() -> None:  # WRK-066, EXT-OUTBOX-1
    ctl = FakeController()
    ctl.terminal_failures = [503, 503]
    a = job(["true"])
    ctl.hand_out(a, kills=[a["job_id"]])

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: ctl.event_index("status", a["job_id"]) != [])
        await r.finish()

    run(go())
    assert ctl.states(a["job_id"]) == ["killed"] * 3
    assert outbox_files() == []


def test_fault_reports_share_the_outbox() -> None:  # WRK-114, EXT-OUTBOX-1
    ctl = FakeController()
    ctl.fault_failures = [500, 403]  # a 4xx is retried too: the device stays out
    a = job(["true"])

    async def go() -> None:
        r = await Running(ctl).started()
        assert r.agent.life is not None
        await r.agent.life.report_fault("box:gpu0", "verify failed: 10-x: exited 1", "j-before")
        assert [x["kind"] for x in records()] == ["fault"]
        ctl.hand_out(a)
        await until(lambda: bool(ctl.terminal(a["job_id"])) and r.agent.outbox is not None)
        await until(lambda: r.agent.outbox is not None and r.agent.outbox.empty)
        await r.finish()

    run(go())
    assert len(ctl.faults) == 3
    assert ctl.event_index("fault", "box:gpu0")[0] < ctl.event_index("status", a["job_id"])[0]


def test_a_disk_that_refuses_does_not_lose_the_report() -> None:  # EXT-OUTBOX-1
    ctl = FakeController()
    ctl.terminal_failures = [500]
    a = job(["true"])

    async def go() -> None:
        r = await Running(ctl).started()
        # The outbox directory is replaced by a file: every write now fails for real.
        directory = Path(worker_helpers.STATE_DIR) / outbox.SUBDIR
        directory.rmdir()
        directory.write_text("in the way")
        ctl.hand_out(a)
        await until(lambda: bool(ctl.event_index("status", a["job_id"])))
        await r.finish()

    run(go())
    assert len(ctl.terminal(a["job_id"])) == 2


def stopped_with_a_report_on_disk(ctl: FakeController, a: dict[str, Any]) -> None:
    """Run ``a`` on a worker that cannot reach the controller's status route, then stop."""

    async def go() -> None:
        ctl.reports_unreachable = True
        r = await Running(ctl, timings=QUICK_SHUTDOWN).started()
        ctl.hand_out(a)
        await until(lambda: r.agent.pending_job_ids == [a["job_id"]])
        await r.finish(10)

    run(go())
    assert [x["job_id"] for x in records()] == [a["job_id"]]


def test_a_restart_resends_before_registering() -> None:
    # EXT-OUTBOX-3, §12 ("reports still in the outbox at exit stay on disk")
    ctl = FakeController()
    a = job(["sh", "-c", "exit 4"], lease_epoch=2)
    stopped_with_a_report_on_disk(ctl, a)
    jid = a["job_id"]
    ctl.reports_unreachable = False
    ctl.terminal_failures = [500, 500, 500, 500]
    mark = len(ctl.events)

    async def go() -> None:
        config = make_config(heartbeat_interval=0.01)
        r = await Running(ctl, config, timings=QUICK_SHUTDOWN).started()
        assert r.agent.outbox is not None and r.agent.outbox.empty
        ctl.hand_out(a)  # re-delivered: its outcome is known here, so it never runs again
        await until(lambda: not ctl.answers)
        await asyncio.sleep(0.1)
        await r.finish()

    run(go())
    after = ctl.events[mark:]
    kinds = [kind for kind, _, _ in after]
    delivered = kinds.index("status")
    assert kinds.index("register") > delivered  # delivered first, then registered
    assert ctl.terminal(jid)[-1] == {
        "state": "failed",
        "exit_code": 4,
        "worker_id": "w-1",
        "lease_epoch": 2,
    }
    # While it waited, heartbeats under the recorded worker ID named it as pending.
    beats = [body for kind, _, body in after[:delivered] if kind == "heartbeat"]
    assert beats and all(b == {"pending_job_ids": [jid]} for b in beats)
    assert ctl.heartbeat_paths[-1] == "/v1/workers/w-1/heartbeat"
    assert ctl.states(jid).count("running") == 1  # it did not run a second time
    assert outbox_files() == []


def test_stop_while_resending_keeps_the_report() -> None:
    ctl = FakeController()
    a = job(["true"])
    stopped_with_a_report_on_disk(ctl, a)

    async def go() -> None:
        r = Running(ctl, timings=QUICK_SHUTDOWN)
        await until(lambda: len(ctl.requests) > 0)
        await asyncio.sleep(0.1)
        await r.finish(5)

    run(go())
    assert len(ctl.registrations) == 1  # only the first worker registered
    assert [x["job_id"] for x in records()] == [a["job_id"]]


def test_outbox_is_delivered_before_a_reregistration() -> None:  # EXT-OUTBOX-3, WRK-150
    ctl = FakeController()
    clock = FakeClock()
    a = job(["true"])
    ctl.hand_out(a)

    async def go() -> None:
        ctl.reports_unreachable = True
        r = await Running(ctl, clock=clock, rng=random.Random(1)).started()
        await until(lambda: r.agent.pending_job_ids == [a["job_id"]])
        ctl.instance = "instance-b"
        await until(lambda: r.agent.contact.owed)
        clock.advance(3600)
        polls = len(ctl.poll_times)
        await until(lambda: len(ctl.poll_times) >= polls + 5)
        assert len(ctl.registrations) == 1  # owed and due, but the outbox is not empty
        ctl.reports_unreachable = False
        await until(lambda: len(ctl.registrations) == 2)
        await r.finish()

    run(go())
    assert ctl.event_index("status", a["job_id"])[-1] < ctl.event_index("register")[-1]


# ---- as a process --------------------------------------------------------------


def test_main_fails_when_the_state_dir_cannot_be_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # EXT-OUTBOX-1, WRK-002
    (tmp_path / "file").write_text("")
    state = tmp_path / "file" / "state"
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(f"controller_url: http://127.0.0.1:9\ndevices: [gpu0]\nstate_dir: {state}\n")
    assert process.main(str(cfg)) == 1
    assert capsys.readouterr().err == f"rc: state_dir: mkdir {state}: not a directory\n"


def test_a_killed_worker_process_leaves_its_report_for_the_next(tmp_path: Path) -> None:
    # EXT-OUTBOX-1: on disk, not in memory
    state = tmp_path / "state"
    gate = tmp_path / "gate"
    env = {**os.environ, "RC_TEST_TIMINGS": "outbox_backoff_max=0.05"}
    ctl = LiveController(tmp_path / "data")
    p = start_worker(tmp_path, ctl.url, state, env=env)
    try:
        with ctl.client() as client:
            script = f"while [ ! -e {gate} ]; do sleep 0.02; done"
            job_id = submit(client, command=["sh", "-c", script])
            deadline = time.monotonic() + 15
            while not pids_with_job_prefix(job_id):
                assert time.monotonic() < deadline and p.poll() is None
                time.sleep(0.02)
        ctl.stop()  # the controller goes away while the job runs...
        gate.write_text("")  # ...so the job's outcome has nowhere to go but the disk
        deadline = time.monotonic() + 15
        while not outbox_files(str(state)):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.02)
        p.kill()  # no shutdown at all: only the disk remembers
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        ctl.stop()
    (record,) = [json.loads(f.read_text()) for f in outbox_files(str(state))]
    assert record["job_id"] == job_id and record["body"]["state"] == "succeeded"
