"""``rc cp`` end to end: real controller, real worker, the box's own ``tar`` (CLI-160..171).

The "box" is this machine, so remote paths are temporary directories here; every byte
still crosses the controller's relay twice.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sqlite3
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from resource_controller.core.states import TERMINAL

from .cluster import Cluster, stop, wait_for


def copy(c: Cluster, src: str, dst: str, **env: str) -> tuple[int, str]:
    r = c.rc("cp", src, dst, timeout=180, **env)
    return r.returncode, r.stderr


def job_count(c: Cluster) -> int:
    status, body = c.api("GET", "/v1/jobs?limit=200")
    assert status == 200
    return len(body["jobs"])


def test_binary_content_round_trips_byte_for_byte(box: Cluster, tmp_path: Path) -> None:
    # CP-001: every byte value, including the ones a terminal would eat.
    src = tmp_path / "all.bin"
    src.write_bytes(bytes(range(256)) * 1000 + b"\r\n\x03\x04\x1a")
    remote = tmp_path / "remote"
    code, err = copy(box, str(src), f"{box.dev}:{remote}/")
    assert code == 0, err
    assert f"copying {src} to {box.dev}:{remote}/" in err
    assert (remote / "all.bin").read_bytes() == src.read_bytes()
    back = tmp_path / "back.bin"
    code, err = copy(box, f"{box.dev}:{remote}/all.bin", str(back))  # renamed on the way
    assert code == 0, err
    assert back.read_bytes() == src.read_bytes()


def test_a_large_file_round_trips(box: Cluster, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for i in range(50):
            f.write(block[i:] + block[:i])
    remote = tmp_path / "remote"
    code, err = copy(box, str(src), f"{box.dev}:{remote}/big.bin")
    assert code == 0, err
    assert (remote / "big.bin").stat().st_size == 50 << 20
    down = tmp_path / "down"
    down.mkdir()
    code, err = copy(box, f"{box.dev}:{remote}/big.bin", str(down))  # into an existing directory
    assert code == 0, err
    assert (down / "big.bin").read_bytes() == src.read_bytes()


def test_a_tree_keeps_modes_the_exec_bit_and_symlinks(box: Cluster, tmp_path: Path) -> None:
    # CP-004, CLI-166: permission bits travel and are re-applied; links stay links.
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "sub" / "data").write_text("x")
    (tree / "sub" / "data").chmod(0o640)
    os.symlink("run.sh", tree / "link")
    remote = tmp_path / "remote"
    code, err = copy(box, str(tree), f"{box.dev}:{remote}/")
    assert code == 0, err
    assert stat.S_IMODE((remote / "tree" / "run.sh").stat().st_mode) == 0o755
    code, err = copy(box, f"{box.dev}:{remote}/tree", str(tmp_path / "again"), RC_SUBMITTER="x")
    assert code == 0, err
    again = tmp_path / "again"
    assert stat.S_IMODE((again / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((again / "sub" / "data").stat().st_mode) == 0o640
    assert os.readlink(again / "link") == "run.sh"
    assert (again / "sub" / "data").read_text() == "x"


def test_a_device_held_by_someone_else_is_refused_and_nothing_is_submitted(
    box: Cluster, tmp_path: Path
) -> None:
    # CLI-162: the lease check comes first; a copy never queues.
    def hold(submitter: str) -> dict[str, str]:
        status, body = box.api(
            "POST",
            "/v1/jobs",
            {
                "device_id": box.dev,
                "submitter": submitter,
                "kind": "hold",
                "max_runtime_seconds": 120,
                "reason": "profiling",
            },
            token="atok",  # an admin may record any submitter, under rc up as well
        )
        assert status == 201, body
        return dict(body)

    alices = hold("alice")
    (tmp_path / "f").write_text("x")
    before = job_count(box)
    code, err = copy(box, str(tmp_path / "f"), f"{box.dev}:{tmp_path}/remote/")
    assert code == 1
    assert "alice" in err and "(a hold)" in err, err
    assert box.api("POST", f"/v1/jobs/{alices['id']}/kill", {}, token="atok")[0] == 200
    box.wait_job(alices["id"], lambda j: j["state"] == "killed")
    mine = hold("tester")
    code, err = copy(box, f"{box.dev}:{tmp_path}/f", str(tmp_path / "g"))
    assert code == 1 and "already hold" in err and mine["id"] in err, err
    code, err = copy(box, str(tmp_path / "f"), "ghost:gpu9:/tmp/x")
    assert code == 1 and "no such device" in err, err
    assert job_count(box) == before + 1  # the second hold; no copy job
    assert not (tmp_path / "remote").exists()


def test_a_far_side_failure_fails_the_copy(box: Cluster, tmp_path: Path) -> None:
    # CLI-169: the box's tar finds nothing to send.
    code, err = copy(box, f"{box.dev}:{tmp_path}/missing", str(tmp_path / "x"))
    assert code == 1
    assert "copy job" in err and "failed" in err, err


def test_argument_errors(box: Cluster, tmp_path: Path) -> None:
    # CLI-160
    code, err = copy(box, f"{box.dev}:/a", f"{box.dev}:/b")
    assert code == 1 and "both remote" in err
    code, err = copy(box, "a", "b")
    assert code == 1 and "host:name:path" in err
    code, err = copy(box, str(tmp_path / "nope"), f"{box.dev}:/tmp/")
    assert code == 1 and "nope" in err


def test_an_archive_escaping_the_destination_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    # CLI-168 against a hostile box: its "tar" sends entries that climb out.
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        for name in ("x/ok", "x/../../escaped"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    fake = fakebin / "tar"
    fake.write_text(f"#!/bin/sh\ncat {evil}\n")
    fake.chmod(0o755)
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"], env={"PATH": f"{fakebin}:{os.environ.get('PATH', '')}"})
    dest = tmp_path / "work" / "dest"
    dest.mkdir(parents=True)
    code, err = copy(cluster, f"{cluster.dev}:/anything/x", str(dest))
    assert code == 1
    assert "x/../../escaped" in err and "escapes" in err, err
    assert (dest / "x" / "ok").read_bytes() == b"hi"
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "work" / "escaped").exists()


def test_an_interrupt_fails_the_copy_and_leaves_the_job_to_end_by_itself(
    box: Cluster, tmp_path: Path
) -> None:
    # CLI-170: SIGINT mid-transfer is an ordinary failure; the copy job is not killed.
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        f.truncate(200 << 20)  # sparse: cheap here, 200 MiB on the wire
    landed = tmp_path / "remote" / "big.bin"
    proc = box.popen_rc("cp", str(src), f"{box.dev}:{landed}")
    try:
        wait_for(lambda: landed.exists() and landed.stat().st_size > 0, 60, "bytes on the box")
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("rc cp was still running 30 s after its SIGINT")
    finally:
        stop(proc)
    assert proc.returncode == 1, err
    announced, *failure = err.splitlines()
    copying = re.escape(f"rc: copying {src} to {box.dev}:{landed}")
    found = re.fullmatch(rf"{copying} \(job (\S+)\)", announced)
    assert found, err
    assert len(failure) == 1 and failure[0].startswith("rc: "), err  # CLI-041
    # The far side saw a truncated stream and ended by itself, not by the submitter.
    job = box.wait_job(found[1], lambda j: j["state"] in TERMINAL, timeout=60)
    assert job["state"] != "succeeded", job
    assert not (job.get("kill_reason") or "").startswith("killed by"), job
    # A running job's kill leaves its reason to the worker (STORE-043): the flag tells.
    with sqlite3.connect(box.tmp / "data" / "rc.db", timeout=10) as db:
        flagged = db.execute("SELECT kill_requested FROM jobs WHERE id = ?", (job["id"],))
        assert flagged.fetchone() == (0,), job
    assert landed.stat().st_size < 200 << 20
