"""A fair share between people (EXT-SHARE), end to end: real ``rc serve`` and ``rc worker``
processes, limits from a file read again on SIGHUP, and a chain of ``rc run --after``."""

from __future__ import annotations

import functools
import signal
import subprocess
import time

from .cluster import RC, Cluster, wait_for


def test_a_bad_limits_file_stops_rc_serve_naming_the_line(cluster: Cluster) -> None:
    bad = cluster.tmp / "limits.yaml"
    bad.write_text("limits:\n  alice: 2\n  bob: -1\n")
    done = subprocess.run(
        [
            RC,
            "serve",
            "--addr",
            f"127.0.0.1:{cluster.port}",
            "--data",
            str(cluster.tmp / "d"),
            "--limits",
            str(bad),
        ],
        env=cluster.env(RC_TOKENS="a:admin"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert f"{bad} line 3: bob: a limit is a whole number of devices" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_limits_queue_one_person_place_the_next_and_follow_sighup(cluster: Cluster) -> None:
    limits = cluster.tmp / "limits.yaml"
    limits.write_text('limits:\n  "*": 1\n')
    controller = cluster.start_controller("--limits", str(limits))
    cluster.start_worker("box", ["gpu0", "gpu1", "gpu2"])
    first = cluster.popen_rc("run", "--", "sleep", "30", RC_SUBMITTER="alice")
    wait_for(lambda: cluster.api("GET", "/v1/state")[1]["jobs"], 20, "alice's first job")
    second = cluster.popen_rc("run", "--", "echo", "alice-two", RC_SUBMITTER="alice")

    def queued() -> list[dict[str, object]]:
        return list(cluster.api("GET", "/v1/state")[1]["queued"])

    wait_for(queued, 20, "alice's second job to queue")
    # bob is behind alice in the queue and is placed anyway: no head-of-line blocking.
    bob = cluster.rc("run", "--", "echo", "bob-ran", RC_SUBMITTER="bob", timeout=60)
    assert bob.returncode == 0 and bob.stdout == "bob-ran\n", (bob.stderr, cluster.logs())
    ps = cluster.rc("ps").stdout
    assert "submitter_limit: at the limit of 1 devices for alice" in ps, ps
    # A raised limit, read again on SIGHUP, places alice's second job at once.
    limits.write_text('limits:\n  alice: 2\n  "*": 1\n')
    controller.send_signal(signal.SIGHUP)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0 and out == "alice-two\n", (err, cluster.logs())
    assert "queued at position 1 for any device — at the limit of 1 devices for alice" in err
    # A bad file on the next SIGHUP is logged and leaves rc serve serving.
    limits.write_text("limits:\n  alice: lots\n")
    controller.send_signal(signal.SIGHUP)
    wait_for(
        lambda: "line 2: alice" in (cluster.tmp / "controller.log").read_text(errors="replace"),
        10,
        "the controller to log the bad file",
    )
    assert controller.poll() is None
    first.send_signal(signal.SIGINT)  # detaches: the job keeps its device
    first.communicate(timeout=15)


def waiting_for(cluster: Cluster, job_id: str) -> str | None:
    """The ID of the job submitted to wait for ``job_id``, once there is one."""
    jobs = cluster.api("GET", "/v1/jobs")[1]["jobs"]
    return next((str(j["id"]) for j in jobs if j.get("after") == [job_id]), None)


def test_a_chain_of_runs_one_after_another(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0", "gpu1"])
    stamp = cluster.tmp / "order"
    first = cluster.rc(
        "run", "--no-wait", "--", "sh", "-c", f"sleep 1; echo one >> {stamp}", timeout=60
    )
    assert first.returncode == 0, first.stderr
    ids = [line.split()[2] for line in first.stderr.splitlines() if line.startswith("rc: job ")]
    prev = ids[0]
    # A job submitted after one that already succeeded runs at once; each next waits.
    procs = []
    for word in ("two", "three"):
        procs.append(
            cluster.popen_rc(
                "run", "--after", prev[:8], "--", "sh", "-c", f"echo {word} >> {stamp}"
            )
        )
        prev = wait_for(functools.partial(waiting_for, cluster, prev), 20, "the submit")
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (err, cluster.logs())
    assert stamp.read_text() == "one\ntwo\nthree\n"


def test_a_failed_job_ends_the_one_waiting_for_it(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    failing = cluster.popen_rc("run", "--", "sh", "-c", "sleep 1; exit 3")
    wait_for(lambda: cluster.api("GET", "/v1/state")[1]["jobs"], 20, "the failing job to start")
    (failing_job,) = cluster.api("GET", "/v1/state")[1]["jobs"]
    waiting = cluster.rc("run", "--after", failing_job["id"], "--", "echo", "never", timeout=60)
    assert failing.wait(30) == 3
    assert waiting.returncode == 1 and waiting.stdout == ""
    assert f"dependency_failed: {failing_job['id']}" in waiting.stderr, waiting.stderr
    # The device went on to the next person: nothing was left holding it.
    start = time.monotonic()
    assert cluster.rc("run", "--", "true", timeout=30).returncode == 0
    assert time.monotonic() - start < 20
