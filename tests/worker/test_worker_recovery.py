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
import worker_helpers
from fake_controller import FakeController, Running, job, make_config, until
from worker_helpers import new_job_id, pids_with_job_prefix, run

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
def journal(tmp_path: Path) -> recovery.Journal:
    """A fresh worker's journal: complete, no job recorded."""
    return recovery.Journal.open(str(tmp_path), fresh=True)


def ours(journal: recovery.Journal, *job_ids: str) -> recovery.Journal:
    for job_id in job_ids:
        journal.started(job_id)
    return journal


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    for name in ("self", "sys", "stat"):
        (root / name).mkdir()  # non-numeric entries are skipped
    monkeypatch.setattr(procs, "PROC_ROOT", str(root))
    return root


def test_manual_clear_claims_nothing_even_when_isolated(
    tree: Path, journal: recovery.Journal, caplog: pytest.LogCaptureFixture
) -> None:  # WRK-141 step 1
    proc(tree, 1)
    with caplog.at_level(logging.INFO, logger="resource_controller.worker.recovery"):
        assert recovery.compute(True, journal, own_pid=1) == {}
    assert "require_manual_clear" in caplog.text
    assert recovery.compute(False, journal, own_pid=1) == {"isolated": True}


def test_isolation(tree: Path, journal: recovery.Journal) -> None:  # WRK-141 step 2
    proc(tree, 1, b"RC_JOB_ID=ours-by-inheritance\0")
    proc(tree, 7, b"RC_JOB_ID=old\0", state="Z")  # zombies do not count
    assert recovery.compute(False, journal, own_pid=1) == {"isolated": True}
    proc(tree, 8)  # another live process: not isolated, so the survivor check decides
    assert recovery.compute(False, journal, own_pid=1) == {"survivors_checked": True}


def test_isolation_needs_pid_1(tree: Path, journal: recovery.Journal) -> None:  # WRK-141 step 2
    proc(tree, ME)
    assert recovery.compute(False, journal, own_pid=ME) == {"survivors_checked": True}


def test_unreadable_proc_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, journal: recovery.Journal
) -> None:
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path / "no-proc"))
    assert recovery.compute(False, journal, own_pid=1) == {}  # PID 1 but blind: no isolation
    assert recovery.compute(False, journal, own_pid=ME) == {}
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path / "a-file"))
    assert recovery.compute(False, journal, own_pid=ME) == {}


def test_survivor_found(tree: Path, journal: recovery.Journal) -> None:  # WRK-141 step 3
    proc(tree, ME, b"RC_JOB_ID=whatever-started-me\0")  # only our own PID is excluded
    proc(tree, 10, b"PATH=/bin\0")
    proc(tree, 11, None)  # blindness elsewhere does not matter once one is found
    proc(tree, 12, b"RC_JOB_ID=\0RC_JOB_ID=old-job\0")
    assert recovery.compute(False, ours(journal, "old-job"), own_pid=ME) == {
        "survivors_checked": True,
        "survivors_found": True,
    }


def test_an_ancestor_carrying_a_job_id_is_a_survivor(
    tree: Path, journal: recovery.Journal
) -> None:  # WRK-142
    """A worker started from inside a job: its parent and grandparent carry the job's
    RC_JOB_ID and are not excluded, only the worker's own PID is."""
    proc(tree, 30, b"RC_JOB_ID=outer-job\0")
    proc(tree, 20, b"RC_JOB_ID=outer-job\0", ppid=30)
    proc(tree, ME, b"RC_JOB_ID=outer-job\0", ppid=20)
    assert procs.self_and_ancestors(ME) == {ME, 20, 30, 1}  # the parentage is real
    assert recovery.compute(False, ours(journal, "outer-job"), own_pid=ME) == {
        "survivors_checked": True,
        "survivors_found": True,
    }


def test_blindness_without_a_match_claims_nothing(
    tree: Path, journal: recovery.Journal
) -> None:  # WRK-141 step 3
    proc(tree, ME)
    proc(tree, 10, b"PATH=/bin\0")
    proc(tree, 11, None)
    proc(tree, 12, b"RC_JOB_ID=another-workers\0")
    assert recovery.compute(False, ours(journal, "mine"), own_pid=ME) == {}
    assert journal.read() == frozenset({"mine"})  # a blind scan proves no record's job gone


def test_clean_check(tree: Path, journal: recovery.Journal) -> None:  # WRK-141 step 3
    proc(tree, ME)
    proc(tree, 10, b"RC_JOB_ID=\0")  # start-up release hooks run with an empty one
    proc(tree, 11, b"RC_JOB_ID=old\0", state="Z")
    (tree / "12").mkdir()  # vanished mid-scan: neither a survivor nor an error
    proc(tree, 13, b"")  # a kernel thread has an empty environment
    assert recovery.compute(False, journal, own_pid=ME) == {"survivors_checked": True}


def test_real_scan_finds_a_live_carrier(journal: recovery.Journal) -> None:  # on the real /proc
    if os.geteuid() != 0:
        pytest.skip("a non-root scan is blind to other users' environments (WRK-143)")
    job_id = new_job_id()
    p = subprocess.Popen(["sleep", "30"], env={**os.environ, "RC_JOB_ID": job_id})
    try:
        found = {"survivors_checked": True, "survivors_found": True}
        assert recovery.compute(False, ours(journal, job_id)) == found
    finally:
        p.kill()
        p.wait()


def test_real_isolation_in_a_fresh_pid_namespace() -> None:  # WRK-141 step 2, for real
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root")
    code = (
        "import json, os; from resource_controller.worker import recovery; "
        "j = recovery.Journal.open('/nonexistent', fresh=False); "
        "print(json.dumps([os.getpid(), recovery.compute(False, j), recovery.compute(True, j)]))"
    )
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0 and "unshare" in p.stderr:
        pytest.skip(f"unshare refused here: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [1, {"isolated": True}, {}]


# ---- whose jobs: the journal in state_dir -----------------------------------


def test_a_job_of_another_worker_is_no_survivor(
    tree: Path, journal: recovery.Journal
) -> None:  # WRK-141 step 3, only this worker's jobs
    """Two workers on one host: the other one's running job never keeps our devices out."""
    proc(tree, ME)
    proc(tree, 10, b"RC_JOB_ID=theirs\0")
    assert recovery.compute(False, ours(journal, "mine"), own_pid=ME) == {"survivors_checked": True}
    assert journal.read() == frozenset()  # nothing carries "mine" any more: its record goes
    proc(tree, 11, b"RC_JOB_ID=mine\0")
    assert recovery.compute(False, ours(journal, "mine"), own_pid=ME) == {
        "survivors_checked": True,
        "survivors_found": True,
    }
    assert journal.read() == frozenset({"mine"})  # still carried: still ours


def test_job_ids_of_any_shape_are_recorded(tree: Path, journal: recovery.Journal) -> None:
    odd = ["../up", ".", "a/b", "x" * 300, "é"]
    assert {recovery.record_name(j)[0] for j in odd} == {"#"}
    assert recovery.record_name("0b8f7c1e-5d2a-4c11-9e0f-3a6b7c8d9e0f")[0] != "#"
    for pid, job_id in enumerate(odd, start=10):
        proc(tree, pid, f"RC_JOB_ID={job_id}\0".encode())
    assert len(journal.read() or ()) == 0
    found = {"survivors_checked": True, "survivors_found": True}
    assert recovery.compute(False, ours(journal, odd[-1]), own_pid=ME) == found
    assert len(journal.read() or ()) == 1


def test_a_journal_that_cannot_say_claims_nothing_while_anything_carries_a_job_id(
    tmp_path: Path, tree: Path
) -> None:
    """A state_dir an older worker used (no journal): any carrier might be ours, so no
    claim; every carrier then counts as ours until a scan shows it gone."""
    old = tmp_path / "old-state"
    old.mkdir()
    journal = recovery.Journal.open(str(old), fresh=False)
    assert journal.read() is None
    proc(tree, ME)
    proc(tree, 10, b"RC_JOB_ID=unknown\0")
    assert recovery.compute(False, journal, own_pid=ME) == {}
    assert journal.read() == frozenset({"unknown"})
    assert recovery.compute(False, journal, own_pid=ME) == {
        "survivors_checked": True,
        "survivors_found": True,
    }
    shutil.rmtree(tree / "10")
    assert recovery.compute(False, journal, own_pid=ME) == {"survivors_checked": True}
    assert journal.read() == frozenset()


def test_nothing_carrying_a_job_id_proves_even_without_a_journal(
    tmp_path: Path, tree: Path
) -> None:
    journal = recovery.Journal.open(str(tmp_path / "missing" / "state"), fresh=False)
    proc(tree, ME)
    proc(tree, 10, b"PATH=/bin\0")
    assert journal.read() is None
    assert recovery.compute(False, journal, own_pid=ME) == {"survivors_checked": True}


def test_a_record_that_cannot_be_written_withholds_the_proof(
    tree: Path, journal: recovery.Journal, caplog: pytest.LogCaptureFixture
) -> None:
    (Path(journal.directory) / "job-x").mkdir()  # a directory where the record goes: EISDIR
    with caplog.at_level(logging.ERROR, logger="resource_controller.worker.recovery"):
        journal.started("job-x")
    assert "job job-x: cannot record it" in caplog.text
    assert journal.read() is None
    proc(tree, ME)
    proc(tree, 10, b"RC_JOB_ID=job-y\0")
    assert recovery.compute(False, journal, own_pid=ME) == {}


def test_a_job_is_recorded_from_its_start_until_a_clean_sweep() -> None:
    ctl = FakeController()
    a = job(["sleep", "30"])
    ctl.hand_out(a)
    records = Path(worker_helpers.STATE_DIR) / recovery.JOURNAL_DIR

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(pids_with_job_prefix(a["job_id"])))
        assert sorted(p.name for p in records.iterdir()) == [".complete", a["job_id"]]
        ctl.hand_out(kills=[a["job_id"]])
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    assert sorted(p.name for p in records.iterdir()) == [".complete"]


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
        # The left-over is a job of this worker now.
        recovery.Journal.open(worker_helpers.STATE_DIR, fresh=False).started("left-over")
        await (await Running(ctl).started()).finish()
        await (await Running(ctl, make_config(require_manual_clear=True)).started()).finish()

    run(go())
    foreign, first, second = ctl.registrations
    assert foreign["recovery"] == {"survivors_checked": True}  # another worker's job
    assert first["recovery"] == {"survivors_checked": True, "survivors_found": True}
    assert wire.RegisterRequest.model_validate(first).recovery == wire.RecoveryProof(
        survivors_checked=True, survivors_found=True
    )
    assert "recovery" not in second  # the all-false proof is omitted entirely
