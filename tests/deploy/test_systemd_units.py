"""The systemd units in ``deploy/systemd/``: ``systemd-analyze verify`` and what they promise.

``verify`` needs no running systemd (it works in a container), but it insists that
each ``ExecStart=`` binary exists, so it checks a copy whose ``rc`` path is this
venv's ``rc``. Warnings (an unknown key, a bad value) fail the test as errors do. In CI
(``CI`` set) ``systemd-analyze`` must be there: ``.ci/run`` installs it.

The other tests tie the units' numbers to the code they must match: the worker's
shutdown bounds, its state directory, the controller's ``--data`` default.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resource_controller.worker import config as worker_config
from resource_controller.worker.timings import DEFAULT as TIMINGS

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
#: Where docs/install.md installs the wheel; every unit's ExecStart starts with it.
INSTALLED_RC = "/opt/resource-controller/bin/rc"
VENV_RC = Path(sys.executable).parent / "rc"
ALL = ("rc-serve.service", "rc-worker.service", "rc-worker@.service")


def _analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is missing in CI: .ci/run installs the systemd package")
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return found


def _service(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser["Service"]


def _seconds(value: str) -> float:
    assert value.endswith("s") and value[:-1].isdigit(), value
    return float(value[:-1])


def test_systemd_analyze_verify_passes_without_warnings(tmp_path: Path) -> None:
    analyze = _analyze()
    assert VENV_RC.is_file()
    copies = []
    for name in ALL:
        text = (UNITS / name).read_text()
        assert f"ExecStart={INSTALLED_RC} " in text, name
        (tmp_path / name).write_text(text.replace(INSTALLED_RC, str(VENV_RC)))
        copies.append(str(tmp_path / name.replace("@.", "@box.")))
    done = subprocess.run(
        [analyze, "verify", *copies],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, SYSTEMD_LOG_COLOR="0"),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    ours = [ln for ln in output.splitlines() if str(tmp_path) in ln or "rc-" in ln]
    assert ours == [], output


def test_verify_does_catch_a_broken_unit(tmp_path: Path) -> None:
    # The check above can fail: a missing binary and an unknown key are both reported.
    analyze = _analyze()
    text = (UNITS / "rc-serve.service").read_text()
    (tmp_path / "rc-serve.service").write_text(text.replace("Restart=", "Restrat=", 1))
    done = subprocess.run(
        [analyze, "verify", str(tmp_path / "rc-serve.service")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Restrat" in done.stdout + done.stderr
    assert done.returncode != 0 or "Unknown key" in done.stdout + done.stderr


@pytest.mark.parametrize("name", ["rc-worker.service", "rc-worker@.service"])
def test_worker_units_let_the_worker_stop_its_own_jobs(name: str) -> None:
    service = _service(name)
    # SIGTERM to the worker only; systemd's SIGKILL for what is left afterwards.
    assert service["KillMode"] == "mixed"
    assert service["KillSignal"] == "SIGTERM"
    # The worker's whole shutdown fits: the job wait (which holds the kill grace) and
    # the release drain, with room for a second round of report retries (WRK-131).
    shutdown = TIMINGS.shutdown_wait + TIMINGS.release_drain_budget
    assert _seconds(service["TimeoutStopSec"]) >= shutdown + 2 * TIMINGS.kill_grace
    assert service["Restart"] == "on-failure"  # a signal stop exits 0 (WRK-004)
    assert service["OOMPolicy"] == "continue"
    # The outbox's directory is the unit's state directory.
    assert "/var/lib/" + service["StateDirectory"] == worker_config.ROOT_STATE_PARENT
    assert service["User"] != "root"


def test_serve_unit_keeps_its_data_in_its_state_directory() -> None:
    from resource_controller.cli.serve import serve

    service = _service("rc-serve.service")
    data = next(p for p in serve.params if p.name == "data").default
    assert str(data) == f"/var/lib/{service['StateDirectory']}"
    assert f"--data {data}" in service["ExecStart"]
    assert service["EnvironmentFile"] == "/etc/rc/serve.env"
    assert service["DynamicUser"] == "yes"
    assert "--addr 127.0.0.1:" in service["ExecStart"]
