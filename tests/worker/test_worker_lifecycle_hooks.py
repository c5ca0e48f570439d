"""Hooks and verify inside a job's steps (WRK-072, HOOK-012/013, VERIFY-008, WRK-127).

The agent serves ``FakeController``, which records every report in the order it was
accepted; jobs, hooks and verify scripts are real processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import worker_helpers
from fake_controller import FakeController, Running, job, until
from worker_helpers import run

from resource_controller.clock import SystemClock
from resource_controller.worker import channel, lifecycle, outbox, reconnect
from resource_controller.worker import config as wc
from resource_controller.worker.timings import Timings


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def config(tmp: Path, device: wc.DeviceConfig, **settings: Any) -> wc.WorkerConfig:
    settings.setdefault("verify_dir", str(tmp / "verify.d"))
    return wc.make_config(
        "http://controller.test",
        [device],
        token="worker-token",
        host="box",
        heartbeat_interval=0.1,
        state_dir=worker_helpers.STATE_DIR,
        **settings,
    )


def terminal_events(ctl: FakeController, job_id: str) -> list[int]:
    return [
        i
        for i, (k, j, state) in enumerate(ctl.events)
        if k == "status" and j == job_id and state != "running"
    ]


def test_failed_acquire_hook_faults_then_fails_the_job_unrun(tmp_path: Path) -> None:
    # HOOK-012: fault first, then `failed` without exit code; never `running`; no verify.
    acquire = script(tmp_path / "acq", "echo 'driver wedged'; exit 7")
    marker = tmp_path / "ran"
    verify_d = tmp_path / "verify.d"
    verify_d.mkdir()
    script(verify_d / "v", f"touch {tmp_path / 'verified'}")
    ctl = FakeController()
    j = job(["touch", str(marker)])

    async def go() -> None:
        cfg = config(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))
        r = await Running(ctl, cfg).started()
        ctl.hand_out(j)
        await until(lambda: bool(ctl.terminal(j["job_id"])))
        await r.finish()

    run(go())
    reason = f"acquire hook failed: hook {acquire}: exited 7\ndriver wedged\n"
    assert ctl.faults == [("box:gpu0", {"reason": reason})]
    (terminal,) = ctl.terminal(j["job_id"])
    assert terminal == {"state": "failed", "worker_id": "w-1", "reason": reason}
    assert ctl.states(j["job_id"]) == ["failed"]
    assert ctl.event_index("fault") < ctl.event_index("status", j["job_id"])
    assert not marker.exists() and not (tmp_path / "verified").exists()


def test_kill_during_acquire_hook_reports_killed_without_fault(tmp_path: Path) -> None:
    acquire = script(tmp_path / "acq", f"touch {tmp_path / 'acq-started'}; exec sleep 30")
    ctl = FakeController()
    j = job(["true"])

    async def go() -> None:
        cfg = config(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))
        r = await Running(ctl, cfg).started()
        ctl.hand_out(j)
        await until(lambda: (tmp_path / "acq-started").exists())
        ctl.hand_out(kills=[j["job_id"]])
        await until(lambda: bool(ctl.terminal(j["job_id"])))
        await r.finish()

    run(go())
    (terminal,) = ctl.terminal(j["job_id"])
    assert terminal == {
        "state": "killed",
        "worker_id": "w-1",
        "reason": f"cancelled during acquire hook: hook {acquire}: cancelled",
    }
    assert ctl.faults == []  # HOOK-013


def test_failed_verify_faults_before_the_report_and_keeps_the_exit_code(tmp_path: Path) -> None:
    verify_d = tmp_path / "verify.d"
    verify_d.mkdir()
    script(verify_d / "10-ecc", 'echo "ecc: 2 uncorrectable on $RC_DEVICE" >&2; exit 1')
    ctl = FakeController()
    j = job(["sh", "-c", "exit 3"])

    async def go() -> None:
        r = await Running(ctl, config(tmp_path, wc.DeviceConfig(name="gpu0"))).started()
        ctl.hand_out(j)
        await until(lambda: bool(ctl.terminal(j["job_id"])))
        await r.finish()

    run(go())
    reason = "verify failed: 10-ecc: exited 1: ecc: 2 uncorrectable on box:gpu0"
    assert ctl.faults == [("box:gpu0", {"reason": reason})]
    (terminal,) = ctl.terminal(j["job_id"])
    assert terminal["state"] == "failed" and terminal["exit_code"] == 3  # VERIFY-008
    assert "reason" not in terminal
    # The fault was accepted before the terminal report was even sent.
    first_terminal = next(
        i
        for i, q in enumerate(ctl.requests)
        if q.path.endswith("/status") and json.loads(q.content)["state"] != "running"
    )
    fault_request = next(i for i, q in enumerate(ctl.requests) if q.path.endswith("/fault"))
    assert fault_request < first_terminal


def test_verify_has_work_only_when_its_directory_holds_a_file(tmp_path: Path) -> None:
    # VERIFY-001: a missing (or empty) directory is a clean pass whenever it runs, so
    # the report may be queued early; a file, even one the pass will skip or fail,
    # keeps the pass ahead of the report (VERIFY-008), and so does an unreadable path.
    verify_d = tmp_path / "verify.d"
    life = lifecycle.Lifecycle(
        to_controller=channel.Channel("http://x", "t", SystemClock(), reconnect.Reconnect()),
        box=outbox.Outbox(str(tmp_path / "box")),
        clock=SystemClock(),
        timings=Timings(),
        track=lambda coro, label: coro.close(),
        config=config(tmp_path, wc.DeviceConfig(name="gpu0")),
    )
    assert not life.verify_has_work()  # missing: off
    verify_d.mkdir()
    assert not life.verify_has_work()  # empty
    (verify_d / "sub").mkdir()
    assert not life.verify_has_work()  # directories are never scripts
    (verify_d / "notes.txt").write_text("not executable")
    assert life.verify_has_work()
    (verify_d / "notes.txt").unlink()
    (verify_d / "sub").rmdir()
    verify_d.rmdir()
    verify_d.write_text("a file where the directory should be")
    assert life.verify_has_work()  # unreadable: the pass reports it


def test_fault_refused_at_first_still_lands_before_the_report(tmp_path: Path) -> None:
    verify_d = tmp_path / "verify.d"
    verify_d.mkdir()
    script(verify_d / "v", "exit 1")
    ctl = FakeController()
    ctl.fault_failures = [503, 503]
    j = job(["true"])

    async def go() -> None:
        r = await Running(ctl, config(tmp_path, wc.DeviceConfig(name="gpu0"))).started()
        ctl.hand_out(j)
        await until(lambda: bool(terminal_events(ctl, j["job_id"])))
        await r.finish()

    run(go())
    (fault,) = ctl.event_index("fault")
    (terminal,) = terminal_events(ctl, j["job_id"])
    assert fault < terminal


def test_hold_runs_the_hooks_and_verify(tmp_path: Path) -> None:  # WRK-127
    log = tmp_path / "hooks.log"
    line = f'echo "$RC_EVENT $RC_JOB_ID" >> {log}'
    acquire = script(tmp_path / "acq", line)
    release = script(tmp_path / "rel", line)
    verify_d = tmp_path / "verify.d"
    verify_d.mkdir()
    script(verify_d / "v", line)
    ctl = FakeController()
    hold = job(["ignored"], kind="hold", max_runtime_seconds=1)
    hold["command"] = []

    async def go() -> None:
        device = wc.DeviceConfig(
            name="gpu0", on_acquire=acquire, on_release=release, release_linger=0.2
        )
        r = await Running(ctl, config(tmp_path, device)).started()
        ctl.hand_out(hold)
        await until(lambda: bool(ctl.terminal(hold["job_id"])))
        await until(lambda: log.exists() and len(log.read_text().splitlines()) == 4)
        await r.finish()

    run(go())
    (terminal,) = ctl.terminal(hold["job_id"])
    assert terminal["reason"] == "max_runtime exceeded (1s)"
    hid = hold["job_id"]
    # The start-up release pass comes first, with no job behind it (HOOK-030).
    assert log.read_text().split("\n")[:4] == [
        "release ",
        f"acquire {hid}",
        f"verify {hid}",
        f"release {hid}",
    ]


def test_heartbeats_go_on_during_a_slow_startup_release_pass(tmp_path: Path) -> None:
    # WRK-041: the heartbeat starts before the pass and names no jobs while it runs.
    done = tmp_path / "released"
    release = script(tmp_path / "rel", f"sleep 1; touch {done}")
    ctl = FakeController()

    async def go() -> None:
        device = wc.DeviceConfig(name="gpu0", on_release=release)
        r = await Running(ctl, config(tmp_path, device)).started()
        await r.finish()

    run(go())
    assert done.exists()
    first_poll = ctl.poll_times[0]
    before = [h for h, t in zip(ctl.heartbeats, ctl.heartbeat_times, strict=True) if t < first_poll]
    assert len(before) >= 5, (len(before), ctl.heartbeat_times, first_poll)
    assert all(h == {} for h in before)


def test_a_job_ending_at_shutdown_still_ships_output_verifies_and_reports(
    tmp_path: Path,
) -> None:
    # WRK-073: after the SIGTERM, the output, the verify pass and the report go through.
    verified = tmp_path / "verified"
    verify_d = tmp_path / "verify.d"
    verify_d.mkdir()
    script(verify_d / "v", f"touch {verified}")
    ctl = FakeController()
    verified_at_report: list[bool] = []
    ctl.on_report = lambda _request: verified_at_report.append(verified.exists())
    j = job(["sh", "-c", "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done"])

    async def go() -> None:
        r = await Running(ctl, config(tmp_path, wc.DeviceConfig(name="gpu0"))).started()
        ctl.hand_out(j)
        await until(lambda: b"up" in ctl.logs.get(j["job_id"], b""))
        await r.finish()

    run(go())
    assert b"bye" in ctl.logs[j["job_id"]]  # written after the SIGTERM
    (terminal,) = ctl.terminal(j["job_id"])
    assert terminal["state"] == "killed" and terminal["reason"] == "cancelled: worker stopped"
    assert verified_at_report == [True]


def test_shutdown_drains_an_armed_release(tmp_path: Path) -> None:  # HOOK-025, WRK-130
    log = tmp_path / "hooks.log"
    release = script(tmp_path / "rel", f'echo "$RC_EVENT $RC_JOB_ID" >> {log}')
    ctl = FakeController()
    j = job(["true"])

    async def go() -> None:
        device = wc.DeviceConfig(name="gpu0", on_release=release, release_linger=3600)
        r = await Running(ctl, config(tmp_path, device)).started()
        ctl.hand_out(j)
        await until(lambda: bool(terminal_events(ctl, j["job_id"])))
        await until(lambda: bool(r.agent.life and r.agent.life.hooks.armed))
        await r.finish()

    run(go())
    assert log.read_text().splitlines() == ["release ", f"release {j['job_id']}"]
