"""Arrays through real processes (EXT-ARRAY-1, EXT-ARRAY-3): every task runs told its index, no
more at once than the cap, and ``rc jobs --array``, ``rc ps`` and ``rc kill`` treat the array as
one thing."""

from __future__ import annotations

from pathlib import Path

from .cluster import Cluster, Json, kill_job_processes, wait_for


def _array(cluster: Cluster, **body: object) -> Json:
    status, made = cluster.api("POST", "/v1/jobs", {"submitter": "tester", **body})
    assert status == 201, made
    return made


def test_each_task_runs_told_its_index_and_the_cap_holds(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0", "gpu1", "gpu2"])
    out = tmp_path / "ran"
    out.mkdir()
    # Each task notes how many run beside it: never more than the cap of 2.
    script = (
        f"touch {out}/live.$RC_ARRAY_INDEX; ls {out} | grep -c live > {out}/seen.$RC_ARRAY_INDEX;"
        f" sleep 0.3; rm {out}/live.$RC_ARRAY_INDEX; echo task $RC_ARRAY_INDEX of $RC_ARRAY_ID"
    )
    made = _array(cluster, command=["sh", "-c", script], array="0-5%2")
    assert (made["size"], made["max_running"], made["spec"]) == (6, 2, "0-5%2")
    ids = [t["id"] for t in made["tasks"]]

    def settled() -> Json | None:
        status, view = cluster.api("GET", f"/v1/arrays/{made['id']}")
        assert status == 200, view
        return view if view["counts"] == {"succeeded": 6} else None

    wait_for(settled, 60, "every task to succeed")
    seen = [int((out / f"seen.{i}").read_text()) for i in range(6)]
    assert max(seen) <= 2, seen
    for index, job_id in enumerate(ids):
        job = cluster.job(job_id)
        assert (job["array_id"], job["array_index"]) == (made["id"], index)
        logs = cluster.rc("logs", job_id)
        assert logs.stdout == f"task {index} of {made['id']}\n", logs.stdout
    listed = cluster.rc("jobs", "--array", made["id"])
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["INDEX", "JOB", "DEVICE", "STATE", "EXIT"], listed.stdout
    assert [line.split()[0] for line in lines[1:]] == [str(i) for i in range(6)]
    assert all(line.split()[3:] == ["succeeded", "0"] for line in lines[1:]), listed.stdout


def test_rc_ps_shows_an_array_as_one_line_and_rc_kill_ends_every_task(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0", "gpu1"])
    made = _array(cluster, command=["sleep", "120"], array="0-4")
    ids = [t["id"] for t in made["tasks"]]
    try:
        wait_for(
            lambda: sum(cluster.job(i)["state"] == "running" for i in ids) == 2, 30, "two running"
        )
        ps = cluster.rc("ps")
        assert ps.returncode == 0, ps.stderr
        (line,) = [line for line in ps.stdout.splitlines() if made["id"] in line]
        assert "array 0-4: 0/5 done · 2 running · 3 queued" in line, ps.stdout
        assert not any(i in ps.stdout for i in ids), ps.stdout
        expanded = cluster.rc("ps", "--tasks")
        assert all(i in expanded.stdout for i in ids), expanded.stdout
        killed = cluster.rc("kill", made["id"])
        assert killed.returncode == 0, killed.stderr
        for job_id in ids:
            ended = cluster.wait_job(job_id, lambda j: j["state"] in ("killed", "failed"), 30)
            # As a kill ends a job: a queued one here, a running one by its worker.
            assert ended["state"] == "killed", ended
            assert ended["kill_reason"] in ("killed by tester", "cancelled"), ended
    finally:
        for job_id in ids:
            kill_job_processes(job_id)


def test_bad_arrays_are_refused_naming_what_is_wrong(cluster: Cluster) -> None:
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    for spec, said in (
        ("5-1", "range 5-1 runs backwards"),
        ("0-20000", "more than 10000 tasks"),
        ("0-3%0", "%N cap"),
    ):
        status, body = cluster.api(
            "POST", "/v1/jobs", {"submitter": "tester", "command": ["true"], "array": spec}
        )
        assert status == 400 and said in body["message"] and "array" in body["message"], body
    status, body = cluster.api(
        "POST",
        "/v1/jobs",
        {"submitter": "tester", "command": ["true"], "array": "0-3", "no_wait": True},
    )
    assert status == 400 and "no_wait" in body["message"], body
    status, listed = cluster.api("GET", "/v1/jobs")
    assert listed["jobs"] == []
    status, body = cluster.api("GET", "/v1/arrays/no-such-array")
    assert status == 404 and body["error"] == "not_found", body


def test_the_python_api_submits_an_array_and_reads_it_back(cluster: Cluster) -> None:
    from resource_controller import Client

    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    with Client(cluster.url, "ctok", submitter="tester") as rc:
        made = rc.submit_array(["sh", "-c", "exit $RC_ARRAY_INDEX"], "0-2", max_runtime="1m")
        assert (made.size, made.spec, [t["index"] for t in made.tasks]) == (3, "0-2", [0, 1, 2])
        done = wait_for(lambda: (lambda a: a if a.done else None)(rc.array(made.id)), 30, "done")
        assert done.failed == [1, 2] and done.counts == {"succeeded": 1, "failed": 2}
        job = rc.job(made.tasks[2]["id"])
        assert (job.array_id, job.array_index, job.exit_code) == (made.id, 2, 2)
