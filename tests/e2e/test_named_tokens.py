"""Tokens that carry a name, end to end: rc serve, rc worker and rc as real processes
(EXT-WHO-2, EXT-WHO-4)."""

from __future__ import annotations

import re

from .cluster import Cluster

NAMED = "wtok:worker,ctok:client,atok:admin,alicetok:client:alice,bobtok:client:bob"
JOB_LINE = re.compile(r"^rc: job (\S+) on (\S+)$", re.M)


def test_kill_under_another_users_named_token_is_refused(cluster: Cluster) -> None:
    cluster.start_controller(tokens=NAMED)
    cluster.start_worker("box", ["gpu0"])
    status, job = cluster.api(
        "POST",
        "/v1/jobs",
        {"device_id": "box:gpu0", "command": ["sleep", "60"], "submitter": "alice"},
        token="alicetok",
    )
    assert status == 201, job
    job_id = job["id"]
    cluster.wait_job(job_id, lambda j: j["state"] == "running")

    # Bob's token cannot borrow alice's name (EXT-WHO-2): 403 not_job_owner, exit 1
    # (CLI-131, CLI-134).
    r = cluster.rc("kill", job_id, "--as", "alice", token="bobtok")
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    assert r.stderr == (
        f"rc: not_job_owner: job {job_id} belongs to 'alice', not the token of 'bob'\n"
    )
    assert cluster.job(job_id)["state"] == "running"

    # Alice's own token ends it.
    r = cluster.rc("kill", job_id, "--as", "alice", token="alicetok")
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"rc: kill requested for {job_id}\n"
    job = cluster.wait_job(job_id, lambda j: j["state"] not in ("assigned", "running"))
    assert job["state"] == "killed", job


def test_whoami(cluster: Cluster) -> None:
    cluster.start_controller(tokens=NAMED)
    r = cluster.rc("whoami", token="alicetok")
    assert (r.returncode, r.stdout, r.stderr) == (0, "role: client\nname: alice\n", "")
    r = cluster.rc("whoami", token="ctok")
    assert (r.returncode, r.stdout, r.stderr) == (0, "role: client\n", "")
    r = cluster.rc("whoami", token="atok")
    assert (r.returncode, r.stdout) == (0, "role: admin\n")
    r = cluster.rc("whoami", token="wtok")
    assert r.returncode == 1 and r.stderr.startswith("rc: forbidden: "), r.stderr


def test_run_as_another_name_warns_and_records_the_tokens_name(cluster: Cluster) -> None:
    cluster.start_controller(tokens=NAMED)
    cluster.start_worker("box", ["gpu0"])

    r = cluster.rc("run", "--as", "bob", "--", "true", token="alicetok")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == (
        "rc: --as 'bob' is recorded as 'alice': this client token is named 'alice' "
        "and owns only that name (and alice@..., alice/...)"
    ), r.stderr
    m = JOB_LINE.search(r.stderr)
    assert m, r.stderr
    assert cluster.job(m.group(1))["submitter"] == "alice"

    # A submitter under the name is kept, and says nothing more than a plain run.
    r = cluster.rc("run", "--as", "alice@laptop/s1", "--", "true", token="alicetok")
    assert r.returncode == 0, r.stderr
    m = JOB_LINE.fullmatch(r.stderr.rstrip("\n"))
    assert m, r.stderr
    assert cluster.job(m.group(1))["submitter"] == "alice@laptop/s1"

    # Without --as the derived/env submitter ("tester") is replaced silently: no extra
    # request is made on that path (EXT-WHO-4 names only --as).
    r = cluster.rc("run", "--", "true", token="alicetok")
    assert r.returncode == 0, r.stderr
    m = JOB_LINE.fullmatch(r.stderr.rstrip("\n"))
    assert m, r.stderr
    assert cluster.job(m.group(1))["submitter"] == "alice"
