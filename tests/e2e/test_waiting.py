"""Saying why a job waits, end to end: real rc serve, rc worker, rc hold, rc run, rc ps (EXT-WHY-2)."""

from __future__ import annotations

import re
import signal

from .cluster import Cluster, wait_for
from .test_hold import GRANTED, Lines


def test_a_job_queued_behind_a_hold_names_the_holder_and_reason(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    hold = Lines(
        cluster.popen_rc(
            "hold", "box:gpu0", "--ttl", "30m", "--reason", "profiling", RC_SUBMITTER="alice"
        )
    )
    hold_id = hold.wait(GRANTED).group(1)
    cluster.wait_job(hold_id, lambda j: j["state"] == "running")

    run = Lines(cluster.popen_rc("run", "-d", "box:gpu0", "--", "echo", "mine"))
    line = run.wait(r"^rc: queued at position 1 for box:gpu0 — ").string
    assert re.fullmatch(
        rf"rc: queued at position 1 for box:gpu0 — held by alice \(job {hold_id[:8]}…, hold"
        r' "profiling"\) for \d+s, at most until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ',
        line,
    ), line

    ps = cluster.rc("ps")
    assert ps.returncode == 0, ps.stderr
    header, *rows = ps.stdout.splitlines()
    assert header.split()[-2:] == ["WAITING", "FOR"]
    queued = next(r for r in rows if "queued (#1)" in r)
    assert queued.rstrip().endswith('alice (hold "profiling")'), ps.stdout

    # --no-wait refuses at once, naming the holder (CLI-104, EXT-WHY-2).
    r = cluster.rc("run", "-d", "box:gpu0", "--no-wait", "--", "true")
    assert r.returncode == 1
    assert "box:gpu0 is busy and could not be queued: held by alice" in r.stderr, r.stderr

    hold.proc.send_signal(signal.SIGINT)  # the hold ends; the queued run gets the device
    assert hold.finish() == 130, hold.lines
    assert run.finish() == 0, (run.lines, cluster.logs())
    assert run.proc.stdout is not None and run.proc.stdout.read() == "mine\n"
    wait_for(lambda: not cluster.api("GET", "/v1/state")[1]["queued"], 10, "an empty queue")
