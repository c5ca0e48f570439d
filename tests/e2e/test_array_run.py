"""``rc run --array`` through real processes (EXT-ARRAY-2): output prefixed by index, the
lowest failed index's exit code after a summary, ``--output-dir``, ``--detach``, Ctrl-C, and
the refusals that submit nothing."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from .cluster import Cluster, wait_for

ECHO = "echo task $RC_ARRAY_INDEX"


@pytest.fixture
def fleet(cluster: Cluster) -> Cluster:
    """A controller and one worker with two devices."""
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0", "gpu1"])
    return cluster


def _array_id(stderr: str) -> str:
    found = re.search(r"rc: array ([0-9a-f-]{36}): (\d+) tasks", stderr)
    assert found, stderr
    return found.group(1)


def _jobs(cluster: Cluster) -> list[dict[str, object]]:
    status, body = cluster.api("GET", "/v1/jobs")
    assert status == 200, body
    jobs: list[dict[str, object]] = body["jobs"]
    return jobs


def test_every_task_succeeds_and_each_line_carries_its_index(fleet: Cluster) -> None:
    r = fleet.rc("run", "--array", "0-5%2", "--", "sh", "-c", f"{ECHO}; exit 0")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert sorted(r.stdout.splitlines()) == sorted(f"[{i}] task {i}" for i in range(6))
    array_id = _array_id(r.stderr)
    assert "6 tasks (0-5%2)" in r.stderr.splitlines()[0]
    status, body = fleet.api("GET", f"/v1/arrays/{array_id}")
    assert status == 200 and body["counts"] == {"succeeded": 6}, body
    assert "6/6 done" in r.stderr


def test_a_failing_subset_exits_with_the_lowest_failed_index_code(fleet: Cluster) -> None:
    script = f"{ECHO}; i=$RC_ARRAY_INDEX; [ $((i % 3)) -eq 1 ] && exit $((i + 2)); exit 0"
    r = fleet.rc("run", "--array", "0-7", "--", "sh", "-c", script)
    assert r.returncode == 3, (r.stdout, r.stderr)
    array_id = _array_id(r.stderr)
    want = f"rc: array {array_id}: 5/8 succeeded; failed: 1 (exit 3), 4 (exit 6), 7 (exit 9)"
    assert want in r.stderr.splitlines(), r.stderr
    assert len(r.stdout.splitlines()) == 8, r.stdout


def test_output_dir_gets_one_file_per_task_and_stdout_nothing(
    fleet: Cluster, tmp_path: Path
) -> None:
    out = tmp_path / "out" / "logs"
    script = f"{ECHO}; printf 'no newline'"
    r = fleet.rc("run", "--array", "1,4,9", "--output-dir", str(out), "--", "sh", "-c", script)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == ["1.log", "4.log", "9.log"]
    assert (out / "4.log").read_text() == "task 4\nno newline"


def test_partial_last_lines_are_flushed_with_their_prefix(fleet: Cluster) -> None:
    r = fleet.rc("run", "--array", "0-1", "--", "sh", "-c", "printf 'a\\nb'")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert sorted(r.stdout.splitlines()) == ["[0] a", "[0] b", "[1] a", "[1] b"]


def test_detach_prints_an_id_the_array_route_knows(fleet: Cluster) -> None:
    r = fleet.rc("run", "--array", "0-3", "--detach", "--", "true")
    assert r.returncode == 0, (r.stdout, r.stderr)
    array_id = r.stdout.strip()
    status, body = fleet.api("GET", f"/v1/arrays/{array_id}")
    assert status == 200 and body["size"] == 4, body
    j = fleet.rc("run", "--array", "0-1", "-o", "json", "--", "true")
    assert j.returncode == 0, j.stderr
    assert '"size":2' in j.stdout and len(j.stdout.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--array", "5-1"], "--array '5-1'"),
        (["--array", "0-20000"], "--array '0-20000'"),
        (["--array", "0-3", "--no-wait"], "--array and --no-wait cannot be used together"),
        (["--array", "0-3", "--timeout", "5s"], "--timeout cannot be used with --array"),
        (["--detach"], "--detach needs --array"),
        (["--output-dir", "x"], "--output-dir needs --array"),
        (["-o", "json"], "-o/--output needs --array"),
    ],
)
def test_refusals_name_the_flag_and_submit_nothing(
    fleet: Cluster, args: list[str], words: str
) -> None:
    r = fleet.rc("run", *args, "--", "true")
    assert r.returncode == 1 and words in r.stderr, (args, r.stderr)
    assert _jobs(fleet) == []


def test_ctrl_c_cancels_the_queued_tasks_and_leaves_the_running_ones(fleet: Cluster) -> None:
    proc = fleet.popen_rc("run", "--array", "0-5%2", "--", "sh", "-c", f"{ECHO}; exec sleep 60")
    assert proc.stderr is not None

    def two_running() -> bool:
        jobs = _jobs(fleet)
        return sum(1 for j in jobs if j["state"] == "running") == 2 and len(jobs) == 6

    wait_for(two_running, 20, "two tasks running")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    array_id = _array_id(err)
    assert f"rc kill {array_id}" in err, err
    status, body = fleet.api("GET", f"/v1/arrays/{array_id}")
    assert status == 200
    assert body["counts"] == {"running": 2, "killed": 4}, body
    r = fleet.rc("kill", array_id)
    assert r.returncode == 0, r.stderr
