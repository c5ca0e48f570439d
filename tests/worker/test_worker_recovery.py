"""The recovery proof at registration (WRK-140..143, WRK-046).

Decisions are checked against ``/proc`` trees built in a temporary directory (the
worker runs as root here, so file modes cannot make an environment unreadable; a
directory where the file should be does, with a real read error). Two checks use the
real process table: a live carrier of ``RC_JOB_ID`` is found, and a worker that is
PID 1 alone in a fresh PID namespace (``unshare``) claims isolation.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_controller import FakeController, Running, make_config
from worker_helpers import new_job_id, run

from resource_controller import wire
from resource_controller.worker import procs, recovery

ME = 4242  # stands in for the worker's own PID inside fake trees


def proc(
    root: Path, pid: int, environ: bytes | None = b"", *, state: str = "S", ppid: int = 1
) -> None:
    """One ``/proc/<pid>``, child of ``ppid``; ``environ=None`` makes the environment
    unreadable."""
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (p {pid}) {state} {ppid} {pid} {pid} 0 -1 0\n")
    if environ is None:
        (d / "environ").mkdir()
    else:
        (d / "environ").write_bytes(environ)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    for name in ("self", "sys", "stat"):
        (root / name).mkdir()  # non-numeric entries are skipped
    monkeypatch.setattr(procs, "PROC_ROOT", str(root))
    return root


def test_manual_clear_claims_nothing_even_when_isolated(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:  # WRK-141 step 1
    proc(tree, 1)
    with caplog.at_level(logging.INFO, logger="resource_controller.worker.recovery"):
        assert recovery.compute(True, own_pid=1) == {}
    assert "require_manual_clear" in caplog.text
    assert recovery.compute(False, own_pid=1) == {"isolated": True}


def test_isolation(tree: Path) -> None:  # WRK-141 step 2
    proc(tree, 1, b"RC_JOB_ID=ours-by-inheritance\0")
    proc(tree, 7, b"RC_JOB_ID=old\0", state="Z")  # zombies do not count
    assert recovery.compute(False, own_pid=1) == {"isolated": True}
    proc(tree, 8)  # another live process: not isolated, so the survivor check decides
    assert recovery.compute(False, own_pid=1) == {"survivors_checked": True}


def test_isolation_needs_pid_1(tree: Path) -> None:  # WRK-141 step 2
    proc(tree, ME)
    assert recovery.compute(False, own_pid=ME) == {"survivors_checked": True}


def test_unreadable_proc_claims_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path / "no-proc"))
    assert recovery.compute(False, own_pid=1) == {}  # PID 1 but blind: no isolation
    assert recovery.compute(False, own_pid=ME) == {}
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path / "a-file"))
    assert recovery.compute(False, own_pid=ME) == {}


def test_survivor_found(tree: Path) -> None:  # WRK-141 step 3
    proc(tree, ME, b"RC_JOB_ID=whatever-started-me\0")  # only our own PID is excluded
    proc(tree, 10, b"PATH=/bin\0")
    proc(tree, 11, None)  # blindness elsewhere does not matter once one is found
    proc(tree, 12, b"RC_JOB_ID=\0RC_JOB_ID=old-job\0")
    assert recovery.compute(False, own_pid=ME) == {
        "survivors_checked": True,
        "survivors_found": True,
    }


def test_an_ancestor_carrying_a_job_id_is_a_survivor(tree: Path) -> None:  # WRK-142
    """A worker started from inside a job: its parent and grandparent carry the job's
    RC_JOB_ID and are not excluded, only the worker's own PID is."""
    proc(tree, 30, b"RC_JOB_ID=outer-job\0")
    proc(tree, 20, b"RC_JOB_ID=outer-job\0", ppid=30)
    proc(tree, ME, b"RC_JOB_ID=outer-job\0", ppid=20)
    assert procs.self_and_ancestors(ME) == {ME, 20, 30, 1}  # the parentage is real
    assert recovery.compute(False, own_pid=ME) == {
        "survivors_checked": True,
        "survivors_found": True,
    }


def test_blindness_without_a_match_claims_nothing(tree: Path) -> None:  # WRK-141 step 3
    proc(tree, ME)
    proc(tree, 10, b"PATH=/bin\0")
    proc(tree, 11, None)
    assert recovery.compute(False, own_pid=ME) == {}


def test_clean_check(tree: Path) -> None:  # WRK-141 step 3
    proc(tree, ME)
    proc(tree, 10, b"RC_JOB_ID=\0")  # start-up release hooks run with an empty one
    proc(tree, 11, b"RC_JOB_ID=old\0", state="Z")
    (tree / "12").mkdir()  # vanished mid-scan: neither a survivor nor an error
    proc(tree, 13, b"")  # a kernel thread has an empty environment
    assert recovery.compute(False, own_pid=ME) == {"survivors_checked": True}


def test_real_scan_finds_a_live_carrier() -> None:  # WRK-141 step 3, on the real /proc
    if os.geteuid() != 0:
        pytest.skip("a non-root scan is blind to other users' environments (WRK-143)")
    env = {**os.environ, "RC_JOB_ID": new_job_id()}
    p = subprocess.Popen(["sleep", "30"], env=env)
    try:
        assert recovery.compute(False) == {"survivors_checked": True, "survivors_found": True}
    finally:
        p.kill()
        p.wait()


def test_real_isolation_in_a_fresh_pid_namespace() -> None:  # WRK-141 step 2, for real
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root")
    code = (
        "import json, os; from resource_controller.worker import recovery; "
        "print(json.dumps([os.getpid(), recovery.compute(False), recovery.compute(True)]))"
    )
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0 and "unshare" in p.stderr:
        pytest.skip(f"unshare refused here: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [1, {"isolated": True}, {}]


# ---- in the registration -----------------------------------------------------


@pytest.fixture
def survivor_tree(tree: Path) -> Iterator[Path]:
    proc(tree, os.getpid())
    proc(tree, 10, b"RC_JOB_ID=left-over\0")
    yield tree


@pytest.mark.usefixtures("survivor_tree")
def test_registration_carries_the_proof() -> None:  # WRK-043, WRK-140
    ctl = FakeController()

    async def go() -> None:
        await (await Running(ctl).started()).finish()
        await (await Running(ctl, make_config(require_manual_clear=True)).started()).finish()

    run(go())
    first, second = ctl.registrations
    assert first["recovery"] == {"survivors_checked": True, "survivors_found": True}
    assert wire.RegisterRequest.model_validate(first).recovery == wire.RecoveryProof(
        survivors_checked=True, survivors_found=True
    )
    assert "recovery" not in second  # the all-false proof is omitted entirely
