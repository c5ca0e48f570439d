"""A name in MIG conflict as ``rc devices``, ``rc describe`` and a waiting job show it,
against a live controller (EXT-MIG-3, EXT-WHY-1a)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.conftest import Rc
from client.live import CLIENT, FakeWorker, LiveController
from resource_controller.core import mig

WHY = "GPU 0 is in MIG mode: its MIG devices are gpu0.mig0, gpu0.mig1, not the whole GPU"


@pytest.fixture
def mig_worker(controller: LiveController) -> Iterator[FakeWorker]:
    """``box`` declaring ``gpu0`` (in conflict) and the instances of GPU 0."""
    w = FakeWorker(
        controller,
        devices=("gpu0", "gpu0.mig0", "gpu0.mig1"),
        labels={
            "gpu0": {"vendor": "nvidia", mig.CONFLICT: WHY},
            "gpu0.mig0": {"vendor": "nvidia", "mig_profile": "3g.20gb", "uuid": "MIG-a"},
            "gpu0.mig1": {"vendor": "nvidia", "mig_profile": "3g.20gb", "uuid": "MIG-b"},
        },
    )
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture
def env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "alice"}


@pytest.mark.usefixtures("mig_worker")
def test_devices_and_describe_say_the_conflict(run_rc: Rc, env: dict[str, str]) -> None:
    table = run_rc("devices", env=env).stdout.splitlines()
    assert table[1].split()[:4] == ["box:gpu0", "ready", "(mig", "conflict)"]
    assert all("mig conflict" not in row for row in table[2:])
    described = run_rc("describe", "box:gpu0", env=env).stdout.splitlines()
    assert described[0].split() == ["box:gpu0", "ready"]
    assert described[1].split(None, 2) == ["MIG", "conflict", f"{WHY}; not offered"]
    assert "mig_conflict=" + WHY in run_rc("describe", "box:gpu0", env=env).stdout
    instance = run_rc("describe", "box:gpu0.mig1", env=env).stdout
    assert "MIG conflict" not in instance and "mig_profile=3g.20gb" in instance


@pytest.mark.usefixtures("mig_worker")
def test_a_job_pinned_to_the_conflicting_name_waits_and_says_why(
    run_rc: Rc, env: dict[str, str], controller: LiveController
) -> None:
    http = controller.http()
    submitted = http.request(
        "POST", "/v1/jobs", body={"command": ["true"], "device_id": "box:gpu0", "submitter": "a"}
    ).json()
    job_id = submitted.get("id") or submitted["job"]["id"]
    view = http.request("GET", f"/v1/jobs/{job_id}").json()
    assert view["job"]["state"] == "queued"
    assert view["waiting_for"] == [{"device_id": "box:gpu0", "mig_conflict": WHY}]
    ps = run_rc("ps", env=env).stdout
    assert "mig conflict" in ps
    # A selector job lands on an instance, never the whole GPU.
    done = run_rc("run", "--select", "vendor=nvidia", "--", "true", env=env)
    assert done.exit_code == 0, done.stderr
    jobs = http.request("GET", "/v1/jobs?state=succeeded").json()
    placed = {j["device_id"] for j in (jobs["jobs"] if isinstance(jobs, dict) else jobs)}
    assert placed and placed <= {"box:gpu0.mig0", "box:gpu0.mig1"}
