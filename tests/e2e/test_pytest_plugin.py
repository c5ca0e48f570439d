"""The ``rc_device`` fixture (EXT-PYAPI-5), used by test suites of their own (pytester).

Each inner suite runs in a subprocess of its own with the plugin loaded from the
installed entry point, against a real ``rc serve`` and ``rc worker``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .cluster import Cluster, free_port, stop, wait_for

pytest_plugins = ("pytester",)

INNER = """
import os
import subprocess
import sys

import pytest
from resource_controller import Client


def seen_by_a_child():
    code = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()


def holder(device_id):
    with Client() as c:
        return {d.id: d.job_id for d in c.devices()}.get(device_id, "")


@pytest.mark.rc_device(device="box:gpu1", ttl="5m")
def test_pinned(rc_device):
    assert rc_device.device_ids == ["box:gpu1"]
    assert rc_device.cuda_visible_devices == "1" and rc_device.epoch > 0
    assert holder("box:gpu1") == rc_device.id
    with Client() as c:
        assert c.job(rc_device.id).reason.startswith("pytest ")
        assert "test_pinned" in c.job(rc_device.id).reason
    # Exported as the worker sets it for a job on box:gpu1 (WRK-076), over the inherited 7.
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert seen_by_a_child() == "1"


def test_after_the_lease_the_inherited_value_is_back():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"


@pytest.mark.rc_device(device=["box:gpu0", "box:gpu1"])
def test_two_devices(rc_device):
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # EXT-GANG-4


@pytest.mark.rc_device(device="box:fpga")
def test_a_name_without_an_index_leaves_it_alone(rc_device):
    assert rc_device.cuda_visible_devices is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7" and seen_by_a_child() == "7"


def test_from_the_ini_option(rc_device):
    assert rc_device.device_id == "box:gpu0"  # rc_device = box:gpu0 in the ini file
    assert rc_device.ttl_seconds == 120  # rc_ttl = 2m
    assert holder("box:gpu0") == rc_device.id


@pytest.mark.rc_device(device="box:gpu0")
def test_that_fails(rc_device):
    assert holder("box:gpu0") == rc_device.id
    raise AssertionError("the test body failed")
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp=tmp_path_factory.mktemp("plugin"), port=free_port())
    try:
        c.start_controller()
        c.start_worker("box", ["gpu0", "gpu1", "fpga"])
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)


def free(fleet: Cluster) -> bool:
    status, state = fleet.api("GET", "/v1/state")
    return status == 200 and not any(v.get("job_id") for v in state["devices"])


def test_the_fixture_leases_a_device_and_releases_it(
    fleet: Cluster, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in fleet.env().items():
        if key.startswith("RC_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # what the inner suite inherits
    pytester.makeini("[pytest]\nrc_device = box:gpu0\nrc_ttl = 2m\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=120)
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*the test body failed*"])
    wait_for(lambda: free(fleet), 20, "every lease the fixture took to be released")
    _, listed = fleet.api("GET", "/v1/jobs?limit=10")
    holds = [j for j in listed["jobs"] if j["kind"] == "hold"]
    assert len(holds) == 5 and all(j["state"] == "killed" for j in holds), holds


def test_no_controller_configured_skips_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RC_CONTROLLER", raising=False)
    monkeypatch.setenv("RC_CONFIG", os.devnull)
    pytester.makepyfile(test_inner="def test_needs_a_gpu(rc_device):\n    raise AssertionError\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=60)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*rc_device: no controller configured*"])


def test_a_bad_marker_is_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RC_CONTROLLER", "http://127.0.0.1:9")
    pytester.makepyfile(
        test_inner=(
            "import pytest\n@pytest.mark.rc_device(gpu='a100')\ndef test_x(rc_device):\n    pass\n"
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*rc_device marker: unknown keyword*"])
