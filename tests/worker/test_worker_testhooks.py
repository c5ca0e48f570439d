"""``RC_TEST_BOOT_ID_PATH`` and ``RC_TEST_TIMINGS``: what end-to-end tests may override."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from live_controller import LiveController, start_worker

from resource_controller.core.testtimings import TestTimingsError
from resource_controller.worker import process, procs
from resource_controller.worker.timings import Timings


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The boot ID path a hook may touch is put back after the test."""
    monkeypatch.setattr(procs, "BOOT_ID_PATH", procs.BOOT_ID_PATH)
    yield
    procs.boot_id.cache_clear()


def test_parse_timings() -> None:
    assert Timings.from_text("") == Timings()
    assert Timings.from_text(" reregister_after=1.5 , straggler_term=0,") == Timings(
        reregister_after=1.5, straggler_term=0.0
    )
    for bad, says in [
        ("bogus=1", "unknown timing 'bogus'"),
        ("reregister_after", "is not name=seconds"),
        ("reregister_after=soon", "is not seconds >= 0"),
        ("reregister_after=-1", "is not seconds >= 0"),
        ("reregister_after=nan", "is not seconds >= 0"),
        ("straggler_term=1,straggler_term=2", "given twice"),
    ]:
        with pytest.raises(TestTimingsError, match=says):
            Timings.from_text(bad)


def test_every_timing_has_a_name() -> None:
    assert set(Timings.names()) >= {
        "reregister_after",
        "reregister_jitter",
        "reregister_retry",
        "outbox_backoff",
        "outbox_backoff_max",
        "report_attempt_timeout",
        "poll_error_backoff",
        "idle_poll_gap",
        "shutdown_wait",
        "kill_grace",
        "straggler_term",
        "straggler_kill",
    }


@pytest.mark.usefixtures("restored")
def test_apply_overrides_the_hooks(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("  simulated-boot-2\n")
    procs.boot_id()  # cached from the real file...
    timings = process.read_test_hooks(
        {
            "RC_TEST_TIMINGS": "reregister_after=2,reregister_jitter=0.5,reregister_retry=3",
            "RC_TEST_BOOT_ID_PATH": str(boot),
        }
    )
    assert (
        timings.reregister_after,
        timings.reregister_jitter,
        timings.reregister_retry,
    ) == (2.0, 0.5, 3.0)
    assert procs.boot_id() == "simulated-boot-2"  # ...and read afresh from the new one


@pytest.mark.usefixtures("restored")
def test_unset_variables_change_nothing() -> None:
    before = procs.BOOT_ID_PATH
    assert process.read_test_hooks({"RC_TEST_TIMINGS": "", "RC_TEST_BOOT_ID_PATH": ""}) == Timings()
    assert before == procs.BOOT_ID_PATH


@pytest.mark.usefixtures("restored")
def test_an_unknown_timing_fails_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RC_TEST_TIMINGS", "heartbeat=1")
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(
        f"controller_url: http://127.0.0.1:9\ndevices: [gpu0]\nstate_dir: {tmp_path / 's'}\n"
    )
    assert process.main(str(cfg)) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("rc: RC_TEST_TIMINGS: unknown timing 'heartbeat'") and err.count("\n") == 1
    )


def test_a_worker_process_reports_the_simulated_boot_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # WRK-135 through RC_TEST_BOOT_ID_PATH
    boot = tmp_path / "boot_id"
    boot.write_text("simulated-boot-1\n")
    env = {**os.environ, "RC_TEST_BOOT_ID_PATH": str(boot)}
    ctl = LiveController(tmp_path / "data")
    # The real controller, with one spy: what its store is asked to register.
    registered: list[str] = []
    register = ctl.svc.store.devices.register

    def spy(host: str, boot_id: str, *rest: Any) -> Any:
        registered.append(boot_id)
        return register(host, boot_id, *rest)

    monkeypatch.setattr(ctl.svc.store.devices, "register", spy)
    p = start_worker(tmp_path, ctl.url, tmp_path / "state", env=env)
    try:
        wait_for(lambda: bool(registered), 15)
    finally:
        p.terminate()
        assert p.wait(timeout=15) == 0
        ctl.stop()
    assert registered[0] == "simulated-boot-1"


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)
