"""The agent's conversation with a controller (§3-7, §9, §12).

The controller here is ``fake_controller.FakeController``, a small implementation of
the worker routes of controller-api.md §6 speaking HTTP/1.1 (h11's server side) on
connections the worker's own client opens; the jobs it hands out are real processes. The last tests run ``rc
worker`` as a real process against the real controller on loopback to check exit
statuses and signals.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fake_controller import (
    FakeController,
    Reply,
    Request,
    Running,
    job,
    make_config,
    outbox_files,
    until,
)
from live_controller import TERMINAL, LiveController, start_worker, submit, wait_state
from worker_helpers import FAST, kill_test_processes, pids_with_job_prefix, run

from resource_controller import wire
from resource_controller.clock import FakeClock
from resource_controller.worker import agent as agent_mod
from resource_controller.worker import channel, probes, process, procs
from resource_controller.worker import config as wc
from resource_controller.worker.timings import Timings

# ---- registration --------------------------------------------------------------


def test_registration_body_and_headers() -> None:  # WRK-030, WRK-043
    ctl = FakeController()

    async def go() -> Running:
        r = await Running(ctl).started()
        await until(lambda: len(ctl.heartbeats) >= 1)
        await r.finish()
        return r

    r = run(go())
    (body,) = ctl.registrations
    assert body["host"] == "box"
    assert body.get("boot_id", "") == procs.boot_id()
    assert body["devices"] == [{"name": "gpu0"}, {"name": "gpu1", "max_runtime_seconds": 3600}]
    facts = body["labels"][""]
    assert set(facts) <= {"cpus", "mem_total_bytes", "disk_free_bytes", "kernel"}
    assert facts["cpus"].isdigit()
    assert {k: v for k, v in body["labels"].items() if k} == {"gpu0": {}, "gpu1": {}}
    assert body["declared_labels"] == {"gpu0": {}, "gpu1": {"rack": "r3"}}
    # SHEET-002/003: no sheet_dir on this host reads as empty sheets, which clear.
    assert body.get("sheet", "") == ""
    assert set(body.get("device_sheets", {}).values()) <= {""}
    # The proof depends on this host's process table (test_worker_recovery pins it
    # down); whatever it is, only true fields travel (WRK-140).
    assert all(v is True for v in body.get("recovery", {}).values())
    assert set(body.get("recovery", {})) <= {"isolated", "survivors_checked", "survivors_found"}
    wire.RegisterRequest.model_validate(body)
    assert r.agent.worker_id == "w-1"
    for request in ctl.requests:
        assert request.headers["authorization"] == "Bearer worker-token"
        assert request.headers["content-type"] == "application/json"
    poll = next(q for q in ctl.requests if q.path.endswith("/assignments"))
    assert poll.headers["host"] == "controller.test"
    # WRK-060, plus the jobs this process has: none yet (a lost hand-out comes again).
    assert poll.target == "/v1/workers/w-1/assignments?wait=30s&have="
    assert ctl.heartbeats[0] == {}  # WRK-050: field omitted when nothing runs
    assert r.agent.contact.instance == "instance-a"  # WRK-032
    assert r.agent.contact.last_at is not None
    assert not r.agent.contact.owed


def test_labels_are_an_explicit_null_when_nothing_was_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # WRK-043, PROBE-040
    monkeypatch.setattr(probes, "builtin_facts", lambda: {})
    ctl = FakeController()

    async def go() -> None:
        await (await Running(ctl).started()).finish()

    run(go())
    raw = next(q for q in ctl.requests if q.path == "/v1/workers/register").content
    assert json.loads(raw)["labels"] is None
    assert b'"labels":null' in raw


def test_no_configured_feature_is_announced_as_inactive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every worker.yaml key now does what it says (probes, sheets, hooks, verify): a
    # configuration that sets them starts without any "not active" warning.
    ctl = FakeController()
    config = make_config(probe_timeout=3.0, probe_interval=60.0)

    async def go() -> None:
        await (await Running(ctl, config).started()).finish()

    with caplog.at_level(logging.WARNING):
        run(go())
    assert not [r for r in caplog.records if "not active" in r.getMessage()]


def test_poll_wait_is_rendered_as_duration_text() -> None:  # WRK-060
    ctl = FakeController()

    async def go() -> None:
        await (await Running(ctl, make_config(poll_wait=90)).started()).finish()
        await (await Running(ctl, make_config(poll_wait=0.5)).started()).finish()

    run(go())
    assert "1m30s" in ctl.poll_waits and "500ms" in ctl.poll_waits


def test_registration_refused() -> None:  # WRK-045
    ctl = FakeController()
    ctl.register_status = 401

    async def go() -> None:
        r = Running(ctl)
        with pytest.raises(agent_mod.RegisterError) as info:
            await asyncio.wait_for(r.task, 10)
        assert str(info.value) == "register: controller returned 401 Unauthorized"

    run(go())
    assert ctl.poll_times == [] and ctl.heartbeats == []


def test_stop_during_registration_returns_quietly() -> None:
    ctl = FakeController()
    ctl.register_hang = True

    async def go() -> None:
        r = Running(ctl)
        await asyncio.sleep(0.1)
        await r.finish(5)

    run(go())


# ---- jobs ----------------------------------------------------------------------


def test_job_runs_ships_output_then_reports() -> None:  # WRK-072, WRK-086, EXT-EPOCH-3a
    ctl = FakeController()
    a = job(["sh", "-c", "echo out; echo err >&2"], lease_epoch=5, future_field={"x": 1})
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    jid = a["job_id"]
    assert ctl.statuses[0] == (jid, {"state": "running", "worker_id": "w-1", "lease_epoch": 5})
    assert ctl.terminal(jid) == [
        {"state": "succeeded", "exit_code": 0, "worker_id": "w-1", "lease_epoch": 5}
    ]
    assert bytes(ctl.logs[jid]) == b"out\nerr\n"
    assert all(q == {"lease_epoch": ["5"]} for q in ctl.log_queries)
    # Output lands before the terminal report (WRK-086).
    kinds = [kind for kind, j, _ in ctl.events if j == jid]
    assert kinds[0] == "status" and kinds[-1] == "status" and "log" in kinds


def test_failed_and_unstartable_jobs() -> None:  # WRK-101
    ctl = FakeController()
    failing = job(["sh", "-c", "exit 3"])
    missing = job(["no-such-program-xyz"])
    ctl.hand_out(failing, missing)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(
            lambda: bool(ctl.terminal(failing["job_id"]) and ctl.terminal(missing["job_id"]))
        )
        await r.finish()

    run(go())
    assert ctl.terminal(failing["job_id"]) == [
        {"state": "failed", "exit_code": 3, "worker_id": "w-1"}
    ]
    (report,) = ctl.terminal(missing["job_id"])
    assert report["state"] == "failed" and report["exit_code"] == -1
    assert report["reason"].startswith("start: ")
    assert "lease_epoch" not in report


def test_a_missing_cwd_fails_the_job_naming_it(tmp_path: Path) -> None:  # EXT-HERE-4
    ctl = FakeController()
    missing = str(tmp_path / "not-here")
    a = job(["pwd"], cwd=missing)
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    assert ctl.terminal(a["job_id"]) == [
        {
            "state": "failed",
            "exit_code": -1,
            "reason": f"cwd {missing}: no such directory",
            "worker_id": "w-1",
        }
    ]


def test_heartbeat_names_exactly_the_supervised_jobs() -> None:  # WRK-050, WRK-051
    ctl = FakeController()
    a = job(["sleep", "0.6"])
    ctl.hand_out(a)

    async def go() -> list[int]:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        after = len(ctl.heartbeats)
        await until(lambda: len(ctl.heartbeats) >= after + 2)
        await r.finish()
        return [after]

    (after,) = run(go())
    named = [h for h in ctl.heartbeats if h]
    assert named and all(h == {"running_job_ids": [a["job_id"]]} for h in named)
    assert all(h == {} for h in ctl.heartbeats[after:])


def meet(mine: Path, other: Path) -> list[str]:
    """A job that marks itself started, then waits (at most ~5 s) for ``other``."""
    wait = f"i=0; while [ ! -e {other} ]; do i=$((i+1)); [ $i -gt 250 ] && exit 1; sleep 0.02; done"
    return ["sh", "-c", f"touch {mine}; {wait}; sleep 0.3"]


def test_two_jobs_from_one_answer_run_at_the_same_time(tmp_path: Path) -> None:  # WRK-071, WRK-050
    # Each waits for the other to have started: run one after the other, the first fails.
    ctl = FakeController()
    mark_a, mark_b = tmp_path / "a", tmp_path / "b"
    a = job(meet(mark_a, mark_b))
    b = job(meet(mark_b, mark_a), device_id="box:gpu1")
    ctl.hand_out(a, b)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"]) and ctl.terminal(b["job_id"])))
        await r.finish()

    run(go())
    for j in (a, b):
        assert ctl.terminal(j["job_id"]) == [
            {"state": "succeeded", "exit_code": 0, "worker_id": "w-1"}
        ]
    both = sorted([a["job_id"], b["job_id"]])
    assert any(sorted(h.get("running_job_ids", [])) == both for h in ctl.heartbeats)


def test_shutdown_waits_for_every_job_of_one_answer(tmp_path: Path) -> None:  # WRK-067
    ctl = FakeController()
    a = job(["sh", "-c", f"touch {tmp_path / 'a'}; exec sleep 30"])
    b = job(["sh", "-c", f"touch {tmp_path / 'b'}; exec sleep 30"], device_id="box:gpu1")
    ctl.hand_out(a, b)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: (tmp_path / "a").exists() and (tmp_path / "b").exists())
        await r.finish()

    run(go())
    for j in (a, b):
        assert ctl.terminal(j["job_id"]) == [
            {
                "state": "killed",
                "exit_code": 143,
                "worker_id": "w-1",
                "reason": "cancelled: worker stopped",
            }
        ]


def test_a_devices_configured_max_runtime_is_not_reapplied() -> None:  # WRK-095
    ctl = FakeController()
    a = job(["sleep", "1.5"])  # no max_runtime_seconds: the controller folded nothing in
    ctl.hand_out(a)
    config = make_config(devices=[wc.DeviceConfig(name="gpu0", max_runtime=1)])

    async def go() -> None:
        r = await Running(ctl, config).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    assert ctl.registrations[0]["devices"] == [{"name": "gpu0", "max_runtime_seconds": 1}]
    assert ctl.terminal(a["job_id"]) == [{"state": "succeeded", "exit_code": 0, "worker_id": "w-1"}]


def test_a_failed_heartbeat_is_one_warning_and_is_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:  # WRK-052
    ctl = FakeController()
    ctl.heartbeat_status = 500
    interval = 0.2

    async def go() -> None:
        with caplog.at_level(logging.WARNING, logger="resource_controller.worker.agent"):
            r = await Running(ctl, make_config(heartbeat_interval=interval)).started()
            await until(lambda: len(ctl.heartbeat_times) >= 3)
            polls = len(ctl.poll_times)
            await until(lambda: len(ctl.poll_times) >= polls + 2)  # polling goes on
            assert not r.task.done()
            await r.finish()

    run(go())
    warned = [r for r in caplog.records if r.getMessage().startswith("heartbeat failed")]
    assert len(warned) == len(ctl.heartbeat_times)  # one warning per heartbeat sent
    assert {(r.levelno, r.getMessage()) for r in warned} == {
        (logging.WARNING, "heartbeat failed: controller returned 500 Internal Server Error")
    }
    gaps = [b - a for a, b in itertools.pairwise(ctl.heartbeat_times)]
    assert all(g >= interval * 0.8 for g in gaps), gaps  # none sent again at once


def test_kill_flag_cancels_a_running_job() -> None:  # WRK-065, WRK-096
    ctl = FakeController()
    a = job(["sleep", "30"])
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(pids_with_job_prefix(a["job_id"])))
        ctl.hand_out(kills=[a["job_id"], "not-ours"])
        ctl.hand_out(kills=[a["job_id"]])  # re-delivered: harmless
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    assert ctl.terminal(a["job_id"]) == [
        {"state": "killed", "exit_code": 143, "worker_id": "w-1", "reason": "cancelled"}
    ]


def test_assignment_killed_in_the_same_answer_never_starts() -> None:  # WRK-066
    ctl = FakeController()
    a = job(["sh", "-c", "echo should-not-run"], lease_epoch=9)
    ctl.hand_out(a, kills=[a["job_id"]])

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        ctl.hand_out(a)  # re-delivered later: dropped, it was seen (WRK-070)
        await until(lambda: not ctl.answers)
        await asyncio.sleep(0.2)
        await r.finish()

    run(go())
    assert ctl.statuses == [
        (
            a["job_id"],
            {
                "state": "killed",
                "reason": "killed before this worker started it",
                "worker_id": "w-1",
                "lease_epoch": 9,
            },
        )
    ]
    assert a["job_id"] not in ctl.logs


def test_a_job_runs_at_most_once() -> None:  # WRK-070
    ctl = FakeController()
    a = job(["true"])
    ctl.hand_out(a, a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        ctl.hand_out(a)
        await until(lambda: not ctl.answers)
        await asyncio.sleep(0.2)
        await r.finish()

    run(go())
    assert ctl.states(a["job_id"]) == ["running", "succeeded"]


def test_terminal_report_is_retried_4xx_included() -> None:  # WRK-112
    ctl = FakeController()
    ctl.terminal_failures = [500, 403]
    a = job(["true"])
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: len(ctl.terminal(a["job_id"])) == 3)
        await asyncio.sleep(0.1)
        await r.finish()

    run(go())
    assert len(ctl.terminal(a["job_id"])) == 3  # delivered on the third attempt


def test_terminal_report_is_retried_past_five_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:  # EXT-OUTBOX-1 (replaces WRK-112's limit)
    ctl = FakeController()
    ctl.terminal_failures = [500] * 8
    a = job(["true"])
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: not r.agent.pending_job_ids and len(ctl.terminal(a["job_id"])) == 9)
        await r.finish()

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.outbox"):
        run(go())
    assert len(ctl.terminal(a["job_id"])) == 9  # eight refusals, then delivered
    assert "retried until the controller answers" in caplog.text
    assert outbox_files() == []


def test_terminal_report_attempts_are_bounded() -> None:
    ctl = FakeController()
    original = ctl._route
    blackholed: list[float] = []

    async def blackhole(request: Request) -> Reply:
        path = request.path
        if path.endswith("/status") and len(blackholed) < 3 and b'"running"' not in request.content:
            blackholed.append(time.monotonic())
            await asyncio.sleep(3600)
        return await original(request)

    ctl._route = blackhole  # type: ignore[method-assign]
    a = job(["true"])
    ctl.hand_out(a)

    async def go() -> float:
        r = await Running(ctl, timings=replace(FAST, report_attempt_timeout=0.1)).started()
        await until(lambda: bool(blackholed))
        began = time.monotonic()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        took = time.monotonic() - began
        await r.finish()
        return took

    assert run(go()) < 2  # three hung attempts, each cut at 0.1 s, then delivered
    assert len(blackholed) == 3


def test_poll_errors_back_off_and_retry() -> None:  # WRK-060, WRK-061
    ctl = FakeController()
    ctl.answers = [
        Reply(500),
        Reply(200, content=b"not json"),
        Reply(200, json=["a list"]),
        Reply(200, json={"assignments": [{"job_id": "x"}]}),  # no command
    ]
    a = job(["true"])
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    gaps = [b - a for a, b in zip(ctl.poll_times, ctl.poll_times[1:5], strict=False)]
    assert all(g >= 0.045 for g in gaps)  # FAST.poll_error_backoff between error polls
    assert ctl.terminal(a["job_id"])[0]["state"] == "succeeded"


def test_idle_polls_are_spaced() -> None:  # WRK-062, WRK-063
    ctl = FakeController()
    ctl.poll_hold = 0.0  # a controller that answers long-polls instantly
    ctl.hand_out(job(["true"]), job(["true"]))
    ctl.hand_out(job(["true"]))

    async def go() -> None:
        r = await Running(ctl, timings=replace(FAST, idle_poll_gap=0.1)).started()
        await asyncio.sleep(0.5)
        await r.finish()

    run(go())
    gaps = [b - a for a, b in zip(ctl.poll_times, ctl.poll_times[1:], strict=False)]
    assert gaps[0] < 0.05  # a poll that started jobs is followed at once
    assert all(g >= 0.095 for g in gaps[2:])
    assert len(ctl.poll_times) <= 8


def test_idle_gap_only_after_a_quick_poll() -> None:  # EXT-FAST-4
    a = agent_mod.Agent(make_config(poll_wait=1.0))
    assert a.idle_gap(0.0) == Timings().idle_poll_gap == 0.25
    assert a.idle_gap(0.49) == 0.25  # under half the wait asked for
    assert a.idle_gap(0.5) == 0.0
    assert a.idle_gap(1.0) == 0.0  # waited out its term: poll again at once
    assert a.idle_gap(3.0) == 0.0


def _idle_polls_taking(took: float, gap: float, run_for: float) -> list[float]:
    """Poll times (real) of an idle worker whose polls each "take" ``took`` seconds on
    its clock (a fake one, advanced by the controller), with an idle gap of ``gap``."""
    clock = FakeClock()
    ctl = FakeController()
    ctl.poll_hold = 0.01
    ctl.on_idle_poll = lambda _wait: clock.advance(took)

    async def go() -> None:
        timings = replace(FAST, idle_poll_gap=gap)
        r = await Running(ctl, make_config(poll_wait=1.0), clock=clock, timings=timings).started()
        await asyncio.sleep(run_for)
        await r.finish()

    run(go())
    return ctl.poll_times


def test_a_poll_that_waited_out_its_term_is_reissued_at_once() -> None:  # EXT-FAST-4
    # A pause this long would allow one poll in the window; there is none.
    times = _idle_polls_taking(took=1.0, gap=30.0, run_for=0.4)
    assert len(times) >= 5, times


def test_a_poll_that_came_back_early_still_pauses() -> None:  # EXT-FAST-4, WRK-062
    times = _idle_polls_taking(took=0.49, gap=0.15, run_for=0.5)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps and all(g >= 0.145 for g in gaps), gaps
    assert len(times) <= 5


def test_shutdown_cancels_jobs_and_reports_them() -> None:  # WRK-130
    ctl = FakeController()
    a = job(["sh", "-c", "echo started; exec sleep 30"])
    ctl.hand_out(a)

    async def go() -> tuple[int, float]:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.logs.get(a["job_id"])))
        began = time.monotonic()
        await r.finish()
        took = time.monotonic() - began
        beats = len(ctl.heartbeats)
        await asyncio.sleep(0.3)
        assert len(ctl.heartbeats) == beats  # the heartbeat stopped
        return beats, took

    _, took = run(go())
    assert took < 5
    assert ctl.terminal(a["job_id"]) == [
        {
            "state": "killed",
            "exit_code": 143,
            "worker_id": "w-1",
            "reason": "cancelled: worker stopped",
        }
    ]
    assert bytes(ctl.logs[a["job_id"]]) == b"started\n"
    assert pids_with_job_prefix(a["job_id"]) == []


def test_shutdown_abandons_jobs_after_its_window(
    caplog: pytest.LogCaptureFixture,
) -> None:  # WRK-130 step 3
    ctl = FakeController()
    a = job(["sh", "-c", "trap '' TERM; echo ready; sleep 30"])
    ctl.hand_out(a)

    async def go() -> None:
        timings = replace(FAST, shutdown_wait=0.3, kill_grace=30.0)
        r = await Running(ctl, timings=timings).started()
        await until(lambda: bool(ctl.logs.get(a["job_id"])))
        await r.finish(10)

    with caplog.at_level(logging.ERROR, logger="resource_controller.worker.agent"):
        run(go())
    assert a["job_id"] in caplog.text and "abandoned" in caplog.text
    deadline = time.monotonic() + 3
    while pids_with_job_prefix(a["job_id"]):  # the abandoned group was killed
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_parse_poll_body() -> None:  # WRK-060, WRK-064
    assert channel.parse_poll_body(b'{"assignments": null}') == channel.PollAnswer([], [])
    answer = channel.parse_poll_body(
        b'{"assignments": [{"job_id": "j", "device_id": "h:g", "command": ["x"],'
        b' "device_ids": ["h:g"], "new": 1}], "kills": ["k"]}'
    )
    assert [a.job_id for a in answer.assignments] == ["j"] and answer.kills == ["k"]
    # EXT-PREEMPT-2: a kill's own grace; a value that is not a number of seconds is left out.
    answer = channel.parse_poll_body(
        b'{"assignments": [], "kills": ["k", "m"], "kill_grace": {"k": 5, "m": "x"}}'
    )
    assert answer.kills == ["k", "m"] and answer.kills.grace == {"k": 5.0}  # type: ignore[attr-defined]
    for bad in (b"[]", b"{", b'{"kills": [1]}', b'{"assignments": [{"job_id": "j"}]}'):
        with pytest.raises(ValueError):
            channel.parse_poll_body(bad)


# ---- as a process --------------------------------------------------------------


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "data")
    yield ctl
    ctl.stop()


@pytest.fixture
def worker_process(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    log_file = (tmp_path / "worker.log").open("w")

    def start(url: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        p = start_worker(tmp_path, url, tmp_path / "state", env=env, stderr=log_file)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
    log_file.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_main_exits_1_when_registration_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # WRK-002, WRK-045
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(
        f"controller_url: http://127.0.0.1:{free_port()}\ndevices: [gpu0]\n"
        f"state_dir: {tmp_path / 'state'}\n"
    )
    assert process.main(str(cfg)) == 1
    err = capsys.readouterr().err
    assert err.startswith("rc: register: ") and err.count("\n") == 1


def test_main_exits_1_on_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # WRK-002, WRK-018
    missing = tmp_path / "nope.yaml"
    assert process.main(str(missing)) == 1
    assert capsys.readouterr().err == (
        f"rc: read worker config: open {missing}: no such file or directory\n"
    )


def running_process(job_id: str) -> None:
    """Wait until the job's process exists (the worker has started it)."""
    deadline = time.monotonic() + 15
    while not pids_with_job_prefix(job_id):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_sigterm_shuts_down_and_exits_0(
    live: LiveController, worker_process: Callable[[str], subprocess.Popen[str]]
) -> None:  # WRK-003, WRK-004, WRK-130
    p = worker_process(live.url)
    with live.client() as client:
        job_id = submit(client, command=["sleep", "30"])
        running_process(job_id)
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
        job = wait_state(client, job_id, TERMINAL)
    # The shutdown's own reason, so the job's owner learns the worker stopped it.
    assert (job["state"], job["exit_code"], job["kill_reason"]) == (
        "killed",
        143,
        "cancelled: worker stopped",
    )


def test_second_signal_takes_the_default_action(
    live: LiveController, worker_process: Callable[[str], subprocess.Popen[str]]
) -> None:  # WRK-003
    # The job ignores SIGTERM, so the shutdown waits out the 10 s grace...
    p = worker_process(live.url)
    with live.client() as client:
        job_id = submit(client, command=["sh", "-c", "trap '' TERM; sleep 30"])
        running_process(job_id)
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert p.poll() is None
    # ...and a second signal ends the worker at once, by the default action.
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=5) == -signal.SIGTERM
    kill_test_processes(job_id)


def test_environment_for_the_subprocess_tests_is_sane() -> None:
    assert os.access(sys.executable, os.X_OK)
