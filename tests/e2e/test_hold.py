"""``rc hold`` end to end: rc serve, rc worker and rc hold as real processes (CLI §5).

A hold exists because a person is present: Ctrl-C once granted releases it and the
device goes back to the pool (CLI-126); Ctrl-C while queued cancels it (CLI-122).
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

from .cluster import Cluster, wait_for

GRANTED = re.compile(r"^rc: hold (\S+) granted on (\S+), expires around (\S+)$")


class Lines:
    """Collect a text-mode child's stderr lines as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait(self, pattern: re.Pattern[str] | str, timeout: float = 15) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r} in {self.lines}")

    def finish(self, timeout: float = 20) -> int:
        code = self.proc.wait(timeout)
        self._thread.join(5)
        return code


def test_ctrl_c_while_granted_releases_the_hold(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    hold = Lines(cluster.popen_rc("hold", "box:gpu0", "--ttl", "30m", "--reason", "profiling"))
    hold_id = hold.wait(GRANTED).group(1)
    hold.wait(rf"rc release {re.escape(hold_id)}.*Ctrl-C")
    cluster.wait_job(hold_id, lambda j: j["state"] == "running")
    hold.proc.send_signal(signal.SIGINT)
    assert hold.finish() == 130, hold.lines
    assert hold.lines[-1] == f"rc: released hold {hold_id}", hold.lines
    assert len(hold.lines) == 3  # nothing beyond the path's own messages (CLI-051)
    job = cluster.wait_job(hold_id, lambda j: j["state"] == "killed")
    assert job["submitter"] == "tester", job  # released under the resolved submitter
    # The device is free again: a job on it runs at once rather than queueing forever.
    r = cluster.rc("run", "-d", "box:gpu0", "--timeout", "20s", "--", "echo", "after")
    assert (r.returncode, r.stdout) == (0, "after\n"), (r.stderr, cluster.logs())


def test_ctrl_c_while_queued_cancels_the_hold(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    status, blocker = cluster.api(
        "POST",
        "/v1/jobs",
        {"device_id": "box:gpu0", "command": ["sleep", "60"], "submitter": "alice"},
    )
    assert status == 201, blocker
    blocker_id = blocker["id"]
    cluster.wait_job(blocker_id, lambda j: j["state"] == "running")
    hold = Lines(cluster.popen_rc("hold", "box:gpu0", "--ttl", "30m", "--reason", "profiling"))
    hold.wait(r"^rc: queued at position 1 for box:gpu0 — held by alice \(job ")  # EXT-WHY-2
    hold.proc.send_signal(signal.SIGINT)
    assert hold.finish() == 130, hold.lines
    hold_id = hold.wait(r"^rc: cancelled queued job (\S+)$").group(1)
    assert len(hold.lines) == 2, hold.lines
    job = cluster.job(hold_id)
    assert (job["state"], job["kind"]) == ("killed", "hold")
    assert job["kill_reason"] == "killed by tester" and not job.get("started_at")
    assert cluster.job(blocker_id)["state"] == "running"  # the holder is untouched
    cluster.api("POST", f"/v1/jobs/{blocker_id}/kill", {"submitter": "alice"})


def test_ttl_ends_the_hold_and_exits_0(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    r = cluster.rc("hold", "--ttl", "1s", "--reason", "quick look")  # any device
    assert r.returncode == 0, (r.stderr, cluster.logs())
    lines = r.stderr.splitlines()
    m = GRANTED.match(lines[0])
    assert m and m.group(2) == "box:gpu0", lines
    assert len(lines) == 3 and m.group(1) in lines[2]
    assert "max_runtime exceeded (1s)" in lines[2]
    wait_for(
        lambda: cluster.api("GET", "/v1/state")[1]["jobs"] == [],
        10,
        "the device to be free",
    )
