"""MIG instances on a worker, against the fake controller (EXT-MIG-1..4).

The fake ``nvidia-smi`` of ``tests/data/nvidia_smi`` is first on the ``PATH`` the agent
and its jobs see, serving recorded A100 and H100 outputs; tests switch its scenario
between calls as an operator would reconfigure a card. Jobs are real processes that
print the environment the worker gave them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import worker_helpers
from fake_controller import FakeController, Running, job, until
from worker_helpers import run

from resource_controller.core import mig
from resource_controller.worker import agent as agent_mod
from resource_controller.worker import config as wc
from support.nvsmi import FakeNvidiaSmi

A100_MIG = [
    "MIG-414beea8-db80-5873-9762-84efefa8037b",
    "MIG-bbec0088-2811-5a60-ba7e-49f58185fa67",
    "MIG-f132dadf-589b-5ff1-87ab-0aae566c816d",
]
A100_MIG_AGAIN_1 = "MIG-ea0e6a6e-5fb5-588e-a7d8-baa2ca9674c4"
H100_NAMES = ["gpu0.mig0", "gpu0.mig1", "gpu1.mig0", "gpu1.mig1", "gpu1.mig2"]
#: A re-registration owed is due at once, so the layout test need not wait 30 s.
FAST = dataclasses.replace(worker_helpers.FAST, reregister_jitter=0.0, reregister_retry=0.05)


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvidiaSmi:
    fake = FakeNvidiaSmi(tmp_path, "a100-40gb-mig")
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    return fake


def config(tmp_path: Path, devices: list[str] | None, **settings: Any) -> wc.WorkerConfig:
    settings.setdefault("heartbeat_interval", 0.1)
    settings.setdefault("state_dir", worker_helpers.STATE_DIR)
    settings.setdefault("probe_dir", str(tmp_path / "no-probe.d"))
    settings.setdefault("verify_dir", str(tmp_path / "no-verify.d"))
    return wc.make_config(
        "http://controller.test",
        devices or [],
        token="worker-token",
        host="box",
        devices_auto=devices is None,
        **settings,
    )


ENV = ["sh", "-c", 'echo "CUDA=${CUDA_VISIBLE_DEVICES-unset} DEV=$RC_DEVICE ALL=$RC_DEVICES"']


def ran(ctl: FakeController, assignment: dict[str, Any]) -> dict[str, Any]:
    (terminal,) = ctl.terminal(assignment["job_id"])
    return terminal


def output(ctl: FakeController, assignment: dict[str, Any]) -> str:
    return bytes(ctl.logs.get(assignment["job_id"], b"")).decode()


def test_jobs_on_instances_see_their_mig_uuids(tmp_path: Path, smi: FakeNvidiaSmi) -> None:
    # EXT-MIG-2: CUDA_VISIBLE_DEVICES=MIG-<uuid>; a gang gets them comma-separated.
    ctl = FakeController()
    one = job(ENV, device_id="box:gpu0.mig1")
    gang = job(ENV, device_id="box:gpu0.mig0", device_ids=["box:gpu0.mig0", "box:gpu0.mig2"])
    whole = job(ENV, device_id="box:gpu1")
    supplied = job(ENV, device_id="box:gpu0.mig1", env={"CUDA_VISIBLE_DEVICES": "mine"})
    names = ["gpu0.mig0", "gpu0.mig1", "gpu0.mig2", "gpu1"]

    async def go() -> None:
        r = await Running(ctl, config(tmp_path, names), timings=FAST).started()
        ctl.hand_out(one, gang, whole, supplied)
        await until(lambda: all(ctl.terminal(j["job_id"]) for j in (one, gang, whole, supplied)))
        await r.finish()

    run(go())
    for j in (one, gang, whole, supplied):
        assert ran(ctl, j)["state"] == "succeeded", ran(ctl, j)
    assert f"CUDA={A100_MIG[1]} DEV=box:gpu0.mig1" in output(ctl, one)
    assert f"CUDA={A100_MIG[0]},{A100_MIG[2]} DEV=box:gpu0.mig0" in output(ctl, gang)
    assert "CUDA=1 DEV=box:gpu1" in output(ctl, whole)  # a whole GPU stays an index
    assert "CUDA=mine" in output(ctl, supplied)  # WRK-076: a supplied value stands
    registered = ctl.registrations[0]
    assert [d["name"] for d in registered["devices"]] == names
    assert registered["labels"]["gpu0.mig1"]["uuid"] == A100_MIG[1]
    assert registered["labels"]["gpu0.mig1"]["mig_profile"] == "2g.10gb"


def test_a_conflicting_name_never_runs(tmp_path: Path, smi: FakeNvidiaSmi) -> None:
    # EXT-MIG-3: gpu0 while GPU 0 is in MIG mode, gpu1.mig0 while GPU 1 is not, and an
    # instance that does not exist: marked at registration, and a job handed out anyway
    # (a controller that ignores the mark) fails with the reason, nothing run, no hook.
    marker = tmp_path / "acquired"
    acquire = tmp_path / "acq"
    acquire.write_text(f"#!/bin/sh\ntouch {marker}\n")
    acquire.chmod(0o755)
    ctl = FakeController()
    jobs = [
        job(["touch", str(tmp_path / "ran")], device_id=f"box:{name}")
        for name in ("gpu0", "gpu1.mig0", "gpu0.mig7")
    ]
    devices: list[str | wc.DeviceConfig] = [
        wc.DeviceConfig(name="gpu0", on_acquire=str(acquire)),
        "gpu1.mig0",
        "gpu0.mig7",
    ]

    async def go() -> None:
        cfg = wc.make_config(
            "http://controller.test",
            devices,
            token="t",
            host="box",
            heartbeat_interval=0.1,
            state_dir=worker_helpers.STATE_DIR,
            probe_dir=str(tmp_path / "none"),
            verify_dir=str(tmp_path / "none"),
        )
        r = await Running(ctl, cfg, timings=FAST).started()
        ctl.hand_out(*jobs)
        await until(lambda: all(ctl.terminal(j["job_id"]) for j in jobs))
        await r.finish()

    run(go())
    labels = ctl.registrations[0]["labels"]
    assert labels["gpu0"][mig.CONFLICT].startswith("GPU 0 is in MIG mode")
    assert labels["gpu1.mig0"][mig.CONFLICT].startswith("GPU 1 is not in MIG mode")
    assert labels["gpu0.mig7"][mig.CONFLICT].startswith("GPU 0 has no MIG device 7")
    reasons = [ran(ctl, j)["reason"] for j in jobs]
    assert reasons[0].startswith("mig conflict: gpu0: GPU 0 is in MIG mode")
    assert reasons[1].startswith("mig conflict: gpu1.mig0: GPU 1 is not in MIG mode")
    assert reasons[2].startswith("mig conflict: gpu0.mig7: GPU 0 has no MIG device 7")
    assert all(ran(ctl, j)["state"] == "failed" for j in jobs)
    assert not (tmp_path / "ran").exists() and not marker.exists()
    assert ctl.faults == []  # the device is not broken: its name is
    assert all(ctl.states(j["job_id"]) == ["failed"] for j in jobs)  # never "running"


def test_an_instance_created_again_between_passes(tmp_path: Path, smi: FakeNvidiaSmi) -> None:
    # EXT-MIG bad input: the UUID changed since the last pass; the job asks again.
    ctl = FakeController()
    first = job(ENV, device_id="box:gpu0.mig1")
    second = job(ENV, device_id="box:gpu0.mig1")

    async def go() -> None:
        r = await Running(ctl, config(tmp_path, ["gpu0.mig1"]), timings=FAST).started()
        ctl.hand_out(first)
        await until(lambda: bool(ctl.terminal(first["job_id"])))
        smi.use("a100-40gb-mig-recreated")
        ctl.hand_out(second)
        await until(lambda: bool(ctl.terminal(second["job_id"])))
        # nvidia-smi down: the job gets the latest listing's UUID rather than none.
        smi.use("no-driver")
        third = job(ENV, device_id="box:gpu0.mig1")
        ctl.hand_out(third)
        await until(lambda: bool(ctl.terminal(third["job_id"])))
        assert f"CUDA={A100_MIG_AGAIN_1} " in output(ctl, third)
        await r.finish()

    run(go())
    assert f"CUDA={A100_MIG[1]} " in output(ctl, first)
    assert f"CUDA={A100_MIG_AGAIN_1} " in output(ctl, second)


def test_an_instance_nobody_can_name_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No nvidia-smi at all: a whole GPU runs as it always did; an instance has no UUID.
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    ctl = FakeController()
    inst = job(["true"], device_id="box:gpu0.mig0")
    whole = job(["/bin/true"], device_id="box:gpu1")

    async def go() -> None:
        r = await Running(ctl, config(tmp_path, ["gpu0.mig0", "gpu1"]), timings=FAST).started()
        ctl.hand_out(inst, whole)
        await until(lambda: bool(ctl.terminal(inst["job_id"]) and ctl.terminal(whole["job_id"])))
        await r.finish()

    run(go())
    assert ran(ctl, inst)["state"] == "failed"
    assert ran(ctl, inst)["reason"] == (
        "mig device unknown: gpu0.mig0: nvidia-smi -L does not list it"
    )
    assert ran(ctl, whole)["state"] == "succeeded"


def test_devices_auto_registers_what_nvidia_smi_lists(tmp_path: Path, smi: FakeNvidiaSmi) -> None:
    # EXT-MIG-1: devices: auto, MIG instances included, at every registration; a layout
    # that changes under a running worker makes it register again once idle (WRK-150).
    smi.use("h100-80gb-mig")
    ctl = FakeController()

    async def go() -> None:
        cfg = config(tmp_path, None, probe_interval=0.2)
        r = await Running(ctl, cfg, timings=FAST).started()
        first = ctl.registrations[0]
        assert [d["name"] for d in first["devices"]] == H100_NAMES
        assert first["labels"]["gpu1.mig0"]["mig_profile"] == "4g.40gb"
        assert set(first["declared_labels"]) == set(H100_NAMES)
        smi.use("h100-80gb")  # both cards taken out of MIG mode
        await until(lambda: len(ctl.registrations) >= 2)
        second = ctl.registrations[1]
        assert [d["name"] for d in second["devices"]] == ["gpu0", "gpu1"]
        assert second["labels"]["gpu0"]["model"] == "NVIDIA H100 80GB HBM3"
        assert r.agent.devices[0].name == "gpu0"
        # Meanwhile the pushes kept the registered names, the stale ones marked.
        pushes = [p for p in ctl.label_pushes if p["devices"] == H100_NAMES]
        marked = [p for p in pushes if mig.CONFLICT in (p["labels"] or {}).get("gpu0.mig0", {})]
        assert marked, ctl.label_pushes
        await r.finish()

    run(go())


def test_devices_auto_without_a_gpu_cannot_register(
    tmp_path: Path, smi: FakeNvidiaSmi
) -> None:  # EXT-MIG-1, WRK-002
    smi.use("no-driver")
    agent = agent_mod.Agent(config(tmp_path, None))

    async def go() -> str:
        with pytest.raises(agent_mod.RegisterError) as refused:
            await agent.gather_facts(registering=True)
        return str(refused.value)

    assert run(go()).startswith("devices: auto: nvidia-smi lists no GPU")
    assert os.environ["RC_FAKE_NVIDIA_SMI"]  # the fake was there; it answered badly
