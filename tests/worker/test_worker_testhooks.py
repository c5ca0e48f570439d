"""``RC_TEST_BOOT_ID_PATH`` and ``RC_TEST_TIMINGS``: what end-to-end tests may override."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loopback import LoopbackController, start_worker

from resource_controller.worker import agent as agent_mod
from resource_controller.worker import procs, reconnect, testhooks


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every attribute a hook may touch is put back after the test."""
    for module, attribute in testhooks.TIMINGS.values():
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, attribute, getattr(mod, attribute))
    monkeypatch.setattr(procs, "BOOT_ID_PATH", procs.BOOT_ID_PATH)
    yield
    procs.forget_boot_id()


def test_parse_timings() -> None:
    assert testhooks.parse_timings("") == {}
    assert testhooks.parse_timings(" reregister_after=1.5 , sweep_term=0,") == {
        "reregister_after": 1.5,
        "sweep_term": 0.0,
    }
    for bad, says in [
        ("bogus=1", "unknown timing 'bogus'"),
        ("reregister_after", "is not name=seconds"),
        ("reregister_after=soon", "is not seconds >= 0"),
        ("reregister_after=-1", "is not seconds >= 0"),
        ("reregister_after=nan", "is not seconds >= 0"),
        ("sweep_term=1,sweep_term=2", "given twice"),
    ]:
        with pytest.raises(testhooks.TestHookError, match=says):
            testhooks.parse_timings(bad)


@pytest.mark.usefixtures("restored")
def test_apply_overrides_the_hooks(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("  simulated-boot-2\n")
    procs.boot_id()  # cached from the real file...
    testhooks.apply(
        {
            "RC_TEST_TIMINGS": "reregister_after=2,reregister_jitter=0.5,reregister_retry=3",
            "RC_TEST_BOOT_ID_PATH": str(boot),
        }
    )
    assert (
        reconnect.REREGISTER_AFTER,
        reconnect.REREGISTER_JITTER,
        reconnect.REREGISTER_RETRY,
    ) == (2.0, 0.5, 3.0)
    assert procs.boot_id() == "simulated-boot-2"  # ...and read afresh from the new one


@pytest.mark.usefixtures("restored")
def test_unset_variables_change_nothing() -> None:
    before = reconnect.REREGISTER_AFTER, procs.BOOT_ID_PATH
    testhooks.apply({"RC_TEST_TIMINGS": "", "RC_TEST_BOOT_ID_PATH": ""})
    assert before == (reconnect.REREGISTER_AFTER, procs.BOOT_ID_PATH)


@pytest.mark.usefixtures("restored")
def test_an_unknown_timing_fails_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RC_TEST_TIMINGS", "heartbeat=1")
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(
        f"controller_url: http://127.0.0.1:9\ndevices: [gpu0]\nstate_dir: {tmp_path / 's'}\n"
    )
    assert agent_mod.main(str(cfg)) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("rc: RC_TEST_TIMINGS: unknown timing 'heartbeat'") and err.count("\n") == 1
    )


@pytest.fixture
def loopback() -> Iterator[LoopbackController]:
    ctl = LoopbackController()
    yield ctl
    ctl.close()


def test_a_worker_process_reports_the_simulated_boot_id(
    tmp_path: Path, loopback: LoopbackController
) -> None:  # WRK-135 through RC_TEST_BOOT_ID_PATH
    boot = tmp_path / "boot_id"
    boot.write_text("simulated-boot-1\n")
    env = {**os.environ, "RC_TEST_BOOT_ID_PATH": str(boot)}
    p = start_worker(tmp_path, loopback.url, tmp_path / "state", env=env)
    try:
        assert loopback.registered.wait(15)
    finally:
        p.terminate()
        assert p.wait(timeout=15) == 0
    wait_for(lambda: bool(loopback.registrations))
    assert loopback.registrations[0]["boot_id"] == "simulated-boot-1"


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)
