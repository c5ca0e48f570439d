"""MIG instances end to end: ``rc serve``, ``rc worker``, ``rc up`` and ``rc run`` as real
processes, with the fake ``nvidia-smi`` of ``tests/data/nvidia_smi`` first on the
worker's ``PATH`` (EXT-MIG-1..4).

- EXT-MIG-1: each instance is its own device with its labels; ``devices: auto`` and
  ``rc up`` offer what nvidia-smi lists, and follow a card put into MIG mode.
- EXT-MIG-2: a job on an instance, or a gang of them, sees ``MIG-<uuid>``.
- EXT-MIG-3: a declared name that does not fit the card is reported at registration
  and by ``rc describe``, and never granted.
- Bad input: instances created again, a GPU that disappears, nvidia-smi failing, all
  while jobs run: every job's outcome is recorded.

Every wait is bounded; processes are stopped by PID (``conftest.cluster``).
"""

from __future__ import annotations

import socket
from pathlib import Path

from resource_controller import Client
from support.nvsmi import FakeNvidiaSmi

from .cluster import Cluster, wait_for

A100_MIG = [
    "MIG-414beea8-db80-5873-9762-84efefa8037b",
    "MIG-bbec0088-2811-5a60-ba7e-49f58185fa67",
    "MIG-f132dadf-589b-5ff1-87ab-0aae566c816d",
]
A100_MIG_AGAIN_1 = "MIG-ea0e6a6e-5fb5-588e-a7d8-baa2ca9674c4"
SHOW = "echo CUDA=$CUDA_VISIBLE_DEVICES"
QUIET = "probe_dir: {tmp}/no-probes\nverify_dir: {tmp}/no-verify\nsheet_dir: {tmp}/no-sheets\n"


def settings(tmp: Path, extra: str = "") -> str:
    return QUIET.format(tmp=tmp) + extra


def device_ids(cluster: Cluster) -> set[str]:
    status, views = cluster.api("GET", "/v1/devices")
    assert status == 200, views
    return {v["device"]["id"] for v in views}


def detected(cluster: Cluster, device_id: str) -> dict[str, str]:
    status, body = cluster.api("GET", f"/v1/devices/{device_id}/describe")
    assert status == 200, body
    return {r["key"]: r["value"] for r in body.get("labels") or [] if r["source"] == "detected"}


def run_on(cluster: Cluster, device: str, script: str = SHOW) -> str:
    done = cluster.rc("run", "-d", device, "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr + cluster.logs()
    return done.stdout.strip()


def test_instances_are_devices_jobs_see_their_uuids(cluster: Cluster, tmp_path: Path) -> None:
    smi = FakeNvidiaSmi(tmp_path, "a100-40gb-mig")
    cluster.start_controller()
    names = ["gpu0.mig0", "gpu0.mig1", "gpu0.mig2", "gpu1"]
    cluster.start_worker("box", names, extra=settings(tmp_path), env=smi.env())
    wait_for(lambda: detected(cluster, "box:gpu0.mig1").get("uuid"), 20, "MIG facts")
    labels = detected(cluster, "box:gpu0.mig1")
    assert {k: labels[k] for k in ("mig_profile", "vram", "parent", "uuid", "model", "driver")} == {
        "mig_profile": "2g.10gb",
        "vram": "10G",
        "parent": "gpu0",
        "uuid": A100_MIG[1],
        "model": "NVIDIA A100-SXM4-40GB",
        "driver": "535.183.01",
    }
    assert detected(cluster, "box:gpu1")["vram"] == "40960M"  # a whole GPU as before
    # EXT-MIG-2: one instance, a gang of instances, a whole GPU.
    assert run_on(cluster, "box:gpu0.mig1") == f"CUDA={A100_MIG[1]}"
    assert run_on(cluster, "box:gpu0.mig0,box:gpu0.mig2") == f"CUDA={A100_MIG[0]},{A100_MIG[2]}"
    assert run_on(cluster, "box:gpu1") == "CUDA=1"
    # A selector on an instance's labels, and a gang by count.
    picked = cluster.rc("run", "--select", "mig_profile=3g.20gb", "--", "sh", "-c", SHOW)
    assert picked.stdout.strip() == f"CUDA={A100_MIG[0]}", picked.stderr
    two = cluster.rc("run", "--count", "2", "--select", "parent=gpu0", "--", "sh", "-c", SHOW)
    assert two.returncode == 0 and two.stdout.strip().count("MIG-") == 2, two.stderr
    described = cluster.rc("describe", "box:gpu0.mig2").stdout
    assert "mig_profile=1g.5gb" in described and "MIG conflict" not in described
    # The Python API's lease says what a job there would see (EXT-PYAPI-3, EXT-MIG-2).
    with (
        Client(cluster.url, "ctok", submitter="tester") as client,
        client.lease(device=["box:gpu0.mig2", "box:gpu0.mig0"], ttl="1m") as lease,
    ):
        assert lease.cuda_visible_devices == f"{A100_MIG[0]},{A100_MIG[2]}"
        assert lease.env["CUDA_VISIBLE_DEVICES"] == lease.cuda_visible_devices


def test_a_name_that_does_not_fit_the_card(cluster: Cluster, tmp_path: Path) -> None:
    # EXT-MIG-3: gpu0 declared while GPU 0 is in MIG mode, gpu1.mig0 while GPU 1 is not.
    smi = FakeNvidiaSmi(tmp_path, "a100-40gb-mig")
    cluster.start_controller()
    names = ["gpu0", "gpu0.mig0", "gpu1", "gpu1.mig0"]
    cluster.start_worker("box", names, extra=settings(tmp_path), env=smi.env())
    wait_for(lambda: "mig_conflict" in detected(cluster, "box:gpu0"), 20, "the conflict")
    worker_log = (cluster.tmp / "worker-box.log").read_text()
    assert "device gpu0: MIG conflict: GPU 0 is in MIG mode" in worker_log
    assert "device gpu1.mig0: MIG conflict: GPU 1 is not in MIG mode" in worker_log
    controller_log = (cluster.tmp / "controller.log").read_text()
    assert "box:gpu0 is not offered: MIG conflict" in controller_log
    described = cluster.rc("describe", "box:gpu0")
    assert "MIG conflict" in described.stdout and "not offered" in described.stdout
    table = cluster.rc("devices").stdout
    assert "(mig conflict)" in table
    # Never granted: a pinned job waits and says why; the others run.
    waiting = cluster.popen_rc("run", "-d", "box:gpu0", "--", "true")
    try:

        def queued_with_reason() -> bool:
            status, state = cluster.api("GET", "/v1/state")
            entries = (state.get("queued_waiting_for") or {}).values() if status == 200 else []
            return any(e.get("mig_conflict") for es in entries for e in es)

        wait_for(queued_with_reason, 20, "the job to wait on the conflict")
        assert run_on(cluster, "box:gpu0.mig0") == f"CUDA={A100_MIG[0]}"
        assert run_on(cluster, "box:gpu1") == "CUDA=1"
        assert waiting.poll() is None  # still waiting
    finally:
        waiting.terminate()  # Ctrl-C while queued cancels the job
        waiting.wait(15)


def test_devices_auto_follows_the_card(cluster: Cluster, tmp_path: Path) -> None:
    # EXT-MIG-1: devices: auto registers what nvidia-smi lists; the card put into MIG
    # mode is offered as its instances at the next (idle) registration, and the old
    # whole-GPU name is never granted again (EXT-MIG-3).
    smi = FakeNvidiaSmi(tmp_path, "h100-80gb")
    cluster.start_controller()
    # The re-registration the new layout owes is due at once, not within 30 s (WRK-152).
    # A long poll ends within 1 s, and only then is a re-registration made (WRK-150).
    env = {**smi.env(), "RC_TEST_TIMINGS": "reregister_jitter=0"}
    extra = settings(tmp_path, "probe_interval: 300ms\npoll_wait: 1s\n")
    cluster.start_worker("auto", "auto", extra=extra, env=env)
    wait_for(lambda: device_ids(cluster) >= {"auto:gpu0", "auto:gpu1"}, 20, "whole GPUs")
    assert run_on(cluster, "auto:gpu1") == "CUDA=1"
    smi.use("h100-80gb-mig")
    want = {"auto:gpu0.mig0", "auto:gpu0.mig1", "auto:gpu1.mig0", "auto:gpu1.mig1"}
    wait_for(lambda: device_ids(cluster) >= want, 30, "the instances")
    wait_for(lambda: "mig_conflict" in detected(cluster, "auto:gpu0"), 20, "gpu0 marked")
    assert "mig_conflict" in detected(cluster, "auto:gpu1")
    for _ in range(3):
        out = cluster.rc("run", "--select", "model~H100", "--", "sh", "-c", "echo $RC_DEVICE")
        assert out.returncode == 0 and ".mig" in out.stdout, out.stdout + out.stderr
    assert run_on(cluster, "auto:gpu1.mig2").startswith("CUDA=MIG-")


def test_rc_up_offers_mig_instances(cluster: Cluster, tmp_path: Path) -> None:
    # EXT-UP-2 with EXT-MIG-1: rc up's devices are what nvidia-smi lists, instances too.
    smi = FakeNvidiaSmi(tmp_path, "a100-40gb-mig")
    cluster.start_up(env=smi.env(), first="gpu0.mig0")
    host = socket.gethostname()
    want = {f"{host}:{n}" for n in ("gpu0.mig0", "gpu0.mig1", "gpu0.mig2", "gpu1")}
    wait_for(lambda: device_ids(cluster) == want, 20, "rc up's devices")
    assert run_on(cluster, f"{host}:gpu0.mig2") == f"CUDA={A100_MIG[2]}"
    assert f"{host}:gpu0.mig0" in (cluster.tmp / "up.log").read_text()  # the banner


def test_bad_nvidia_smi_output_never_loses_a_job(cluster: Cluster, tmp_path: Path) -> None:
    # Instances created again, damaged output, a GPU gone, nvidia-smi down, all while
    # jobs run: each job's outcome is recorded, and later jobs get current UUIDs.
    smi = FakeNvidiaSmi(tmp_path, "a100-40gb-mig")
    cluster.start_controller()
    names = ["gpu0.mig0", "gpu0.mig1", "gpu1"]
    cluster.start_worker(
        "box", names, extra=settings(tmp_path, "probe_interval: 200ms\n"), env=smi.env()
    )
    gate, up = tmp_path / "gate", tmp_path / "up"
    up.mkdir()
    hold = f"{SHOW}; touch {up}/$$; while [ ! -e {gate} ]; do sleep 0.05; done"
    jobs = [cluster.popen_rc("run", "-d", f"box:{n}", "--", "sh", "-c", hold) for n in names]
    wait_for(lambda: len(list(up.iterdir())) == len(names), 20, "three jobs started")

    def passes_after(seen: int) -> bool:
        return len(smi.calls()) >= seen + 4  # two passes, two calls each

    for scenario in ("a100-40gb-mig-recreated", "malformed", "a100-40gb-gpu1-gone", "no-driver"):
        smi.use(scenario)
        seen = len(smi.calls())
        wait_for(lambda: passes_after(seen), 20, f"two passes: {scenario}")  # noqa: B023
    gate.touch()
    outputs = []
    for proc in jobs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err + cluster.logs()
        outputs.append(out.strip())
    assert outputs == [f"CUDA={A100_MIG[0]}", f"CUDA={A100_MIG[1]}", "CUDA=1"]
    # The last listing nvidia-smi gave had GPU 0 whole (gpu1-gone): its instances are
    # marked, and stay marked while nvidia-smi is down. Back in MIG mode, with the
    # instances created again: offered once more, with their new UUIDs.
    assert "mig_conflict" in detected(cluster, "box:gpu0.mig1")
    smi.use("a100-40gb-mig-recreated")
    wait_for(lambda: "mig_conflict" not in detected(cluster, "box:gpu0.mig1"), 20, "no conflict")
    assert run_on(cluster, "box:gpu0.mig1") == f"CUDA={A100_MIG_AGAIN_1}"
