"""A job on several devices inside the worker (EXT-GANG-4, EXT-GANG-5).

The agent serves ``FakeController``; jobs, hooks and verify scripts are real processes.
"""

from __future__ import annotations

from pathlib import Path

import worker_helpers
from fake_controller import FakeController, Running, job, until
from worker_helpers import run

from resource_controller import wire
from resource_controller.worker import config as wc
from resource_controller.worker import runner


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def two_devices(tmp: Path, acquire: str, release: str) -> wc.WorkerConfig:
    """Three devices with the same hooks; jobs take two of them."""
    devices = [
        wc.DeviceConfig(name=n, on_acquire=acquire, on_release=release, release_linger=0.1)
        for n in ("gpu0", "gpu1", "gpu2")
    ]
    return wc.make_config(
        "http://controller.test",
        devices,
        token="worker-token",
        host="box",
        heartbeat_interval=0.1,
        state_dir=worker_helpers.STATE_DIR,
        verify_dir=str(tmp / "verify.d"),
    )


def test_the_environment_names_every_device() -> None:  # EXT-GANG-4
    a = wire.Assignment(
        job_id="j", device_id="b:gpu1", device_ids=["b:gpu1", "b:gpu3"], command=["x"]
    )
    env = runner.build_env(a, {"CUDA_VISIBLE_DEVICES": "7", "RC_DEVICES": "stale"})
    assert env["RC_DEVICES"] == "b:gpu1,b:gpu3" and env["RC_DEVICE"] == "b:gpu1"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    # A device name without an index: not set by the worker, the inherited value passes.
    odd = a.model_copy(update={"device_ids": ["b:gpu1", "b:nvme"]})
    assert runner.build_env(odd, {"CUDA_VISIBLE_DEVICES": "7"})["CUDA_VISIBLE_DEVICES"] == "7"
    assert "CUDA_VISIBLE_DEVICES" not in runner.build_env(odd, {})
    # A job-supplied value is left as supplied.
    own = a.model_copy(update={"env": {"CUDA_VISIBLE_DEVICES": "0"}})
    assert runner.build_env(own, {})["CUDA_VISIBLE_DEVICES"] == "0"
    # A controller that sends no list (the reference) means the one device.
    base = wire.Assignment(job_id="j", device_id="b:gpu2", command=["x"])
    assert runner.build_env(base, {})["RC_DEVICES"] == "b:gpu2"


def test_hooks_and_verify_run_per_device_and_a_failure_faults_that_device(
    tmp_path: Path,
) -> None:  # EXT-GANG-5
    log = tmp_path / "hooks.log"
    line = f'echo "$RC_EVENT $RC_DEVICE $RC_JOB_ID" >> {log}'
    acquire = script(tmp_path / "acq", line)
    release = script(tmp_path / "rel", line)
    verify_d = tmp_path / "verify.d"
    verify_d.mkdir()
    script(verify_d / "v", line + '\n[ "$RC_DEVICE" = box:gpu2 ] && { echo dirty >&2; exit 1; }\n:')
    out = tmp_path / "env"
    ctl = FakeController()
    j = job(
        ["sh", "-c", f'echo "$RC_DEVICES $CUDA_VISIBLE_DEVICES" > {out}'],
        device_ids=["box:gpu0", "box:gpu2"],
    )

    async def go() -> None:
        cfg = two_devices(tmp_path, acquire, release)
        r = await Running(ctl, cfg).started()
        ctl.hand_out(j)
        await until(lambda: bool(ctl.terminal(j["job_id"])))
        await until(lambda: log.read_text().count(f"{j['job_id']}") >= 6)
        await r.finish()

    run(go())
    assert out.read_text().split() == ["box:gpu0,box:gpu2", "0,2"]
    (terminal,) = ctl.terminal(j["job_id"])
    assert terminal["state"] == "succeeded"  # a dirty device says nothing about the run
    # Only the device whose verify failed is faulted.
    assert [d for d, _ in ctl.faults] == ["box:gpu2"]
    # This job's hook runs (the start-up release pass, HOOK-030, has no job ID).
    events = [e.rsplit(" ", 1)[0] for e in log.read_text().splitlines() if j["job_id"] in e]
    assert [e for e in events if e.startswith("acquire")] == [
        "acquire box:gpu0",
        "acquire box:gpu2",
    ]
    assert [e for e in events if e.startswith("verify")] == [
        "verify box:gpu0",
        "verify box:gpu2",
    ]
    assert sorted(e for e in events if e.startswith("release")) == [
        "release box:gpu0",
        "release box:gpu2",
    ]


def test_a_failed_acquire_gives_back_the_devices_already_acquired(tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    acquire = script(
        tmp_path / "acq",
        f'echo "$RC_EVENT $RC_DEVICE $RC_JOB_ID" >> {log}\n'
        '[ "$RC_DEVICE" = box:gpu1 ] && { echo wedged; exit 5; }\n:',
    )
    release = script(tmp_path / "rel", f'echo "$RC_EVENT $RC_DEVICE $RC_JOB_ID" >> {log}')
    marker = tmp_path / "ran"
    ctl = FakeController()
    j = job(["touch", str(marker)], device_ids=["box:gpu0", "box:gpu1"])

    async def go() -> None:
        cfg = two_devices(tmp_path, acquire, release)
        r = await Running(ctl, cfg).started()
        ctl.hand_out(j)
        await until(lambda: bool(ctl.terminal(j["job_id"])))
        await until(lambda: f"release box:gpu0 {j['job_id']}" in log.read_text())
        await r.finish()

    run(go())
    assert not marker.exists()
    assert [d for d, _ in ctl.faults] == ["box:gpu1"]
    (terminal,) = ctl.terminal(j["job_id"])
    assert terminal["state"] == "failed"
    assert f"release box:gpu1 {j['job_id']}" not in log.read_text()  # never acquired
