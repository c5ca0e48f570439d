"""No request can hurt the fleet (EXT-LIMITS), end to end with real processes."""

from __future__ import annotations

import sqlite3
import time
import uuid

from .cluster import Cluster, wait_for

POISON_RUNTIME = 9_223_372_036_854_775_000  # now + runtime + 600 overflows 64 bits


def _insert_poisoned_job(cluster: Cluster, device_id: str) -> str:
    """A queued job the API would refuse (EXT-LIMITS-1), written straight into the store.

    It stands for any row a scheduling pass cannot handle: granting it a lease overflows
    the deadline column.
    """
    job_id = str(uuid.uuid4())
    now = int(time.time())
    with sqlite3.connect(cluster.tmp / "data" / "rc.db", timeout=10) as db:
        seq = (db.execute("SELECT max(seq) FROM jobs").fetchone()[0] or 0) + 1
        db.execute(
            "INSERT INTO jobs (id, seq, command, submitter, state, device_id, submitted_at,"
            " priority, max_runtime_seconds, queued_at) VALUES (?, ?, ?, ?, 'queued', ?, ?, 10, ?, ?)",
            (job_id, seq, '["true"]', "p", device_id, now, POISON_RUNTIME, now),
        )
    return job_id


def test_one_poisoned_job_does_not_stop_scheduling(cluster: Cluster) -> None:
    """EXT-LIMITS-3: the pass skips the bad row, logs its ID, and places the others."""
    cluster.start_controller()
    cluster.start_worker("box-a", ["gpu0", "gpu1"])
    poisoned = _insert_poisoned_job(cluster, "box-a:gpu1")

    # The same request through the API is refused, naming the field (EXT-LIMITS-1).
    status, err = cluster.api(
        "POST",
        "/v1/jobs",
        {
            "command": ["true"],
            "device_id": "box-a:gpu1",
            "submitter": "p",
            "priority": 10,
            "max_runtime_seconds": POISON_RUNTIME,
        },
    )
    assert status == 400, err
    assert err["error"] == "bad_request" and "max_runtime_seconds" in err["message"]

    # A job behind it (lower priority, another device, and one on the poisoned job's own
    # device) is still scheduled and runs to completion.
    r = cluster.rc("run", "-d", "box-a:gpu0", "--", "sh", "-c", "echo placed", timeout=60)
    assert r.returncode == 0, (r.stderr, cluster.logs())
    assert "placed" in r.stdout
    r = cluster.rc("run", "-d", "box-a:gpu1", "--", "true", timeout=60)
    assert r.returncode == 0, (r.stderr, cluster.logs())

    # The poisoned job stays queued (an operator can kill it), and the log names it.
    assert cluster.job(poisoned)["state"] == "queued"
    wait_for(
        lambda: poisoned in (cluster.tmp / "controller.log").read_text(errors="replace"),
        10,
        "the controller to log the skipped job",
    )
    status, _ = cluster.api("POST", f"/v1/jobs/{poisoned}/kill", {"submitter": "p"})
    assert status == 200
    assert cluster.job(poisoned)["state"] == "killed"
