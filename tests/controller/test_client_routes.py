"""Client and admin routes (controller-api.md §7): submit, history, kill, logs, fleet views."""

from __future__ import annotations

import queue
import re
import time
from typing import Any

import pytest
from controller_harness import Follower, Harness, assert_empty_ok, assert_error

from resource_controller import errors
from resource_controller.controller.routes import jobs as job_routes

T0 = "2027-01-15T08:00:00Z"  #: the fake clock's start, as the API writes it (API-004)
ZERO_INSTANT = "0001-01-01T00:00:00Z"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def kill(rc: Harness, job_id: str, submitter: str | None = "alice", admin: bool = False) -> Any:
    c = rc.admin if admin else rc.client
    body = {} if submitter is None else {"submitter": submitter}
    return c.post(f"/v1/jobs/{job_id}/kill", json=body)


# ---- API-041: submit validation, in order -----------------------------------------------

VALIDATION: list[tuple[dict[str, Any], str, str]] = [
    # (fields over a valid pinned job, code, a word the message must contain)
    ({"kind": "batch"}, "bad_request", "batch"),
    ({"kind": "Job"}, "bad_request", "Job"),
    ({"command": []}, "bad_request", "command"),
    ({"command": None}, "bad_request", "command"),
    # hold rules: each names what is wrong
    ({"kind": "hold", "max_runtime_seconds": 60}, "bad_request", "command"),
    ({"kind": "hold", "command": [], "max_runtime_seconds": 60, "cwd": "/x"}, "bad_request", "cwd"),
    (
        {"kind": "hold", "command": [], "max_runtime_seconds": 60, "env": {"A": "1"}},
        "bad_request",
        "env",
    ),
    (
        {"kind": "hold", "command": [], "max_runtime_seconds": 60, "idle_timeout_seconds": 5},
        "bad_request",
        "idle",
    ),
    ({"kind": "hold", "command": []}, "bad_request", "max_runtime_seconds"),
    (
        {"kind": "hold", "command": [], "max_runtime_seconds": -1},
        "bad_request",
        "max_runtime_seconds",
    ),
    (
        {"kind": "hold", "command": [], "max_runtime_seconds": 60, "stdio": "tty"},
        "bad_request",
        "stdio",
    ),
    ({"stdio": "TTY"}, "bad_request", "TTY"),
    ({"stdio": "logs"}, "bad_request", "logs"),
    ({"selector": "vendor=nvidia"}, "bad_request", "both"),
    ({"submitter": ""}, "bad_request", "submitter"),
    ({"priority": 11}, "priority_out_of_range", "-10..10"),
    ({"priority": -11}, "priority_out_of_range", "-10..10"),
    # first failure wins
    ({"kind": "x", "command": [], "submitter": "", "priority": 99}, "bad_request", "kind"),
    ({"command": [], "stdio": "x", "submitter": ""}, "bad_request", "command"),
    ({"stdio": "x", "selector": "a=b", "submitter": ""}, "bad_request", "stdio"),
    ({"selector": "a=b", "submitter": "", "priority": 99}, "bad_request", "both"),
    ({"submitter": "", "priority": 99}, "bad_request", "submitter"),
]


def test_submit_validation_order(rc: Harness) -> None:
    rc.register()
    for fields, code, word in VALIDATION:
        r = rc.submit_raw(device_id="gpubox:gpu0", **fields)
        assert word in assert_error(r, 400, code), fields
    assert_error(rc.client.post("/v1/jobs", content=b"{"), 400, "bad_request")
    # Selector errors come last and name the bad term (no device_id here).
    for fields in [{"priority": 99, "selector": "==="}]:
        assert_error(rc.submit_raw(**fields), 400, "priority_out_of_range")
    msg = assert_error(rc.submit_raw(selector="vendor=nvidia,bogus"), 400, "bad_selector")
    assert "bogus" in msg
    assert rc.client.get("/v1/jobs").json() == {"jobs": []}  # nothing was queued


def test_submit_accepts_the_edges(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1", "gpu2", "gpu3"))
    assert rc.submit(device_id="gpubox:gpu0", priority=10)["priority"] == 10
    assert rc.submit(device_id="gpubox:gpu1", priority=-10)["priority"] == -10
    assert rc.submit(device_id="gpubox:gpu2", kind="job", stdio="pipe")["stdio"] == "pipe"
    hold = rc.submit(
        device_id="gpubox:gpu3", kind="hold", command=[], max_runtime_seconds=600, reason="debug"
    )
    assert hold["command"] == ["hold"] and hold["kind"] == "hold"
    assert hold["max_runtime_seconds"] == 600 and hold["reason"] == "debug"


def test_submit_answers_the_bare_job(rc: Harness) -> None:
    # API-042 step 5 / API-020: 201 with the Job object; empty fields omitted.
    wid = rc.register()
    r = rc.submit_raw(device_id="gpubox:gpu0")
    assert r.status_code == 201
    assert r.headers["content-type"].startswith("application/json")
    job = r.json()
    assert UUID.match(job["id"])
    assert job == {
        "id": job["id"],
        "selector": "",
        "kind": "job",
        "command": ["python", "train.py"],
        "cwd": "",
        "submitter": "alice",
        "priority": 0,
        "queued_at": T0,
        "state": "assigned",
        "device_id": "gpubox:gpu0",
        "worker_id": wid,
        "submitted_at": T0,
        "lease_epoch": job["lease_epoch"],  # EXT-EPOCH-2
        "device_ids": ["gpubox:gpu0"],  # EXT-GANG-6: beside device_id, its first
    }


def test_submit_queues_behind_a_busy_device(rc: Harness) -> None:
    rc.register()
    first = rc.submit(device_id="gpubox:gpu0")
    second = rc.submit(device_id="gpubox:gpu0", submitter="bob")
    assert first["state"] == "assigned"
    assert second["state"] == "queued"
    assert second["worker_id"] == "" and second["device_id"] == "gpubox:gpu0"
    assert "lease_epoch" not in second


def test_submit_refusals_from_the_store(rc: Harness) -> None:
    # API-042 step 1.
    rc.register(
        "gpubox",
        ({"name": "gpu0", "max_runtime_seconds": 100}, "gpu1"),
        labels={
            "gpu0": {"vendor": "nvidia"},
            "gpu1": {"vendor": "amd"},
        },
    )
    rc.register(
        "other",
        ({"name": "gpu0", "max_runtime_seconds": 50},),
        labels={
            "gpu0": {"vendor": "nvidia"},
        },
    )
    msg = assert_error(rc.submit_raw(device_id="nohost:gpu7"), 400, "unknown_device")
    assert "nohost:gpu7" in msg
    assert_error(rc.submit_raw(selector="vendor=intel"), 400, "no_matching_device")
    r = rc.submit_raw(device_id="gpubox:gpu0", max_runtime_seconds=101)
    assert_error(r, 400, "runtime_above_ceiling")
    # A selector job is refused only when it is above EVERY matching device's ceiling.
    r = rc.submit_raw(selector="vendor=nvidia", max_runtime_seconds=101)
    assert_error(r, 400, "runtime_above_ceiling")
    assert rc.submit(selector="vendor=nvidia", max_runtime_seconds=100)["state"] == "assigned"
    assert rc.client.get("/v1/jobs").json()["jobs"][0]["max_runtime_seconds"] == 100
    # A pinned job without a runtime inherits its device's ceiling.
    assert rc.submit(device_id="other:gpu0")["max_runtime_seconds"] == 50
    assert len(rc.client.get("/v1/jobs").json()["jobs"]) == 2


def test_selector_job_is_placed_and_normalised(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1"), labels={"gpu1": {"vendor": "nvidia"}})
    job = rc.submit(selector=" vendor = nvidia ")
    assert job["selector"] == "vendor=nvidia"
    assert job["state"] == "assigned" and job["device_id"] == "gpubox:gpu1"


def test_neither_device_nor_selector_means_any_device(rc: Harness) -> None:
    # EXT-CLI-1: no device at all is no_matching_device; otherwise any device is taken.
    assert_error(rc.submit_raw(), 400, "no_matching_device")
    rc.register("gpubox", ("gpu0", "gpu1"))
    a = rc.submit()
    b = rc.submit()
    c = rc.submit()
    assert a["selector"] == "" and b["selector"] == ""
    assert {a["device_id"], b["device_id"]} == {"gpubox:gpu0", "gpubox:gpu1"}
    assert a["state"] == b["state"] == "assigned"
    # Queued "any device" jobs show no device until placed (EXT-CLI-1a).
    assert c["state"] == "queued" and c["device_id"] == "" and c["selector"] == ""


def test_a_blocked_job_ahead_claims_only_its_own_candidates(rc: Harness) -> None:
    # STORE-062 seen through submit: a queued pinned job reserves its busy device only;
    # a job behind it that could also run elsewhere takes the unclaimed device at once.
    rc.register("gpubox", ("gpu0", "gpu1"))
    rc.submit(device_id="gpubox:gpu0")
    assert rc.submit(device_id="gpubox:gpu0")["state"] == "queued"
    job = rc.submit()  # any device
    assert job["state"] == "assigned" and job["device_id"] == "gpubox:gpu1"


def test_no_wait(rc: Harness) -> None:
    # API-042 step 4: refused with 409 when it would queue; the job stays in history.
    rc.register()
    first = rc.submit(device_id="gpubox:gpu0", no_wait=True)
    assert first["state"] == "assigned"
    r = rc.submit_raw(device_id="gpubox:gpu0", no_wait=True, submitter="bob")
    assert "gpubox:gpu0" in assert_error(r, 409, "no_device_available")
    jobs = rc.client.get("/v1/jobs", params={"submitter": "bob"}).json()["jobs"]
    assert len(jobs) == 1
    refused = jobs[0]
    assert refused["state"] == "killed"
    assert refused["kill_reason"] == "no-wait: device busy"
    assert refused["finished_at"] == T0
    assert rc.client.get("/v1/state").json()["queued"] == []


def test_idempotency_key_returns_the_same_job(rc: Harness) -> None:
    rc.register()
    a = rc.submit(device_id="gpubox:gpu0", idempotency_key="k-1")
    rc.clock.advance(5)
    r = rc.submit_raw(device_id="gpubox:gpu0", idempotency_key="k-1", command=["other"])
    assert r.status_code == 201
    b = r.json()
    assert b["id"] == a["id"] and b["command"] == a["command"]
    assert b["idempotency_key"] == "k-1"
    assert [j["id"] for j in rc.client.get("/v1/jobs").json()["jobs"]] == [a["id"]]


def test_idempotent_repeat_is_checked_in_store_order(rc: Harness) -> None:
    # STORE-056: the key is looked up after the selector checks (step 2/3) but before the
    # pinned device must exist (step 3/4).
    wid = rc.register("gpubox", ("gpu0", "gpu1"), labels={"gpu0": {"vendor": "nvidia"}})
    pinned = rc.submit(device_id="gpubox:gpu1", idempotency_key="pin")
    rc.report(pinned["id"], wid, "succeeded", exit_code=0)
    assert rc.admin.delete("/v1/devices/gpubox:gpu1").status_code == 200
    r = rc.submit_raw(device_id="gpubox:gpu1", idempotency_key="pin")
    assert r.status_code == 201 and r.json()["id"] == pinned["id"]
    assert r.json()["state"] == "succeeded"  # returned unchanged, whatever its state
    assert_error(rc.submit_raw(device_id="gpubox:gpu1"), 400, "unknown_device")
    rc.submit(selector="vendor=nvidia", idempotency_key="sel")
    push = {"host": "gpubox", "devices": ["gpu0"], "labels": {"gpu0": {"vendor": "amd"}}}
    assert_empty_ok(rc.worker.post(f"/v1/workers/{wid}/labels", json=push))
    r = rc.submit_raw(selector="vendor=nvidia", idempotency_key="sel")
    assert_error(r, 400, "no_matching_device")


# ---- API-043 / API-044: job history ------------------------------------------------------


def test_job_list_limit_parsing(rc: Harness) -> None:
    rc.register()
    ids = []
    for _ in range(22):
        ids.append(rc.submit(device_id="gpubox:gpu0")["id"])
        rc.clock.advance(1)
    assert len(rc.client.get("/v1/jobs").json()["jobs"]) == 20  # default
    for ok, n in [("1", 1), ("200", 22), ("+3", 3), ("021", 21)]:
        assert len(rc.client.get("/v1/jobs", params={"limit": ok}).json()["jobs"]) == n, ok
    for bad in ["", "0", "201", "-1", "abc", "1.5", "1e2", " 5", "٣", "0x10"]:
        msg = assert_error(rc.client.get("/v1/jobs", params={"limit": bad}), 400, "bad_request")
        assert "limit" in msg, bad


def test_job_list_filters_and_order(rc: Harness) -> None:
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    a = rc.submit(device_id="gpubox:gpu0")
    rc.clock.advance(1)
    b = rc.submit(device_id="gpubox:gpu1", submitter="bob")
    rc.clock.advance(1)
    c = rc.submit(device_id="gpubox:gpu0", submitter="bob")  # queued behind a
    rc.take(wid)
    rc.report(b["id"], wid, "succeeded", exit_code=0)

    def ids(**params: str) -> list[str]:
        r = rc.client.get("/v1/jobs", params=params)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["jobs"]]

    assert ids() == [c["id"], b["id"], a["id"]]  # newest submission first
    assert ids(state="queued") == [c["id"]]
    assert ids(state="succeeded") == [b["id"]]
    assert ids(state="running") == [a["id"]]
    assert ids(state="lost") == []
    assert ids(state="") == ids()  # empty is absent
    assert ids(device="gpubox:gpu0") == [c["id"], a["id"]]
    assert ids(submitter="bob") == [c["id"], b["id"]]
    assert ids(submitter="bob", device="gpubox:gpu0", state="queued") == [c["id"]]
    assert ids(device="", submitter="") == ids()
    assert ids(submitter="nobody") == []
    for bad in ["Queued", "done", "active"]:
        assert_error(rc.client.get("/v1/jobs", params={"state": bad}), 400, "bad_request")


def test_job_list_id_prefix(rc: Harness) -> None:
    # EXT-CLI-7: jobs whose ID starts with the prefix, newest first, under the limit.
    rc.register()
    made = []
    for _ in range(3):
        made.append(rc.submit(device_id="gpubox:gpu0")["id"])
        rc.clock.advance(1)

    def ids(**params: str) -> list[str]:
        r = rc.client.get("/v1/jobs", params=params)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["jobs"]]

    for job_id in made:
        assert ids(id_prefix=job_id[:8]) == [job_id] or job_id in ids(id_prefix=job_id[:8])
        assert ids(id_prefix=job_id) == [job_id]
    assert ids(id_prefix="") == ids() == made[::-1]
    assert (
        ids(id_prefix=made[0][:1], limit="1")
        == [j for j in made[::-1] if j.startswith(made[0][:1])][:1]
    )
    for wild in ("%", "_", "%%%%%%", "______", made[0][:5] + "_"):
        assert ids(id_prefix=wild) == [], wild
    assert ids(id_prefix=made[0].upper()) == ([made[0]] if made[0] == made[0].upper() else [])
    msg = assert_error(rc.client.get("/v1/jobs", params={"state": "done"}), 400, "bad_request")
    assert "queued" in msg and "lost" in msg  # EXT-CLI-8: the valid states are named


def test_job_list_ties_break_by_id_descending(rc: Harness) -> None:
    rc.register()
    made = [rc.submit(device_id="gpubox:gpu0")["id"] for _ in range(4)]  # same second
    listed = [j["id"] for j in rc.client.get("/v1/jobs").json()["jobs"]]
    assert listed == sorted(made, reverse=True)


def test_job_list_pages_with_before(rc: Harness) -> None:
    # The next page of a listing: the jobs after the given one in the listing's order,
    # ties in one second included, filters applied as on the first page.
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    for _ in range(3):
        for device in ("gpubox:gpu0", "gpubox:gpu1", "gpubox:gpu0"):  # several a second
            rc.submit(device_id=device)
        rc.clock.advance(1)
    rc.take(wid)

    def ids(**params: str) -> list[str]:
        r = rc.client.get("/v1/jobs", params=params)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["jobs"]]

    for filters in ({}, {"device": "gpubox:gpu0"}, {"state": "queued"}):
        everything = ids(**filters, limit="200")
        assert len(everything) >= 3, filters
        for size in (1, 2, 4):
            paged: list[str] = []
            while True:
                page = ids(**filters, limit=str(size), **({"before": paged[-1]} if paged else {}))
                paged += page
                if len(page) < size:
                    break
            assert paged == everything, (filters, size)
    # The cursor is a position: a job the filter leaves out still marks where to go on.
    newest_queued, running = ids(state="queued")[0], ids(state="running")
    assert running and ids(state="running", before=newest_queued) == running
    full, queued = ids(limit="200"), set(ids(state="queued", limit="200"))
    for cursor in running:
        after = [j for j in full[full.index(cursor) + 1 :] if j in queued]
        assert ids(state="queued", before=cursor, limit="200") == after
    assert ids(before=ids()[-1]) == []
    assert ids(before="") == ids()  # empty is absent
    msg = assert_error(rc.client.get("/v1/jobs", params={"before": "nope"}), 400, "bad_request")
    assert "before" in msg and "nope" in msg


# ---- API-045: one job -------------------------------------------------------------------


def test_job_view_and_queue_position(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0",), labels={"gpu0": {"vendor": "nvidia"}})
    running = rc.submit(device_id="gpubox:gpu0")
    q1 = rc.submit(device_id="gpubox:gpu0")
    q2 = rc.submit(device_id="gpubox:gpu0")
    sel = rc.submit(selector="vendor=nvidia")
    urgent = rc.submit(device_id="gpubox:gpu0", priority=5)

    def view(job_id: str) -> dict[str, Any]:
        r = rc.client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200
        return dict(r.json())

    assert set(view(running["id"])) == {"job"}  # not queued: position omitted
    assert view(running["id"])["job"]["id"] == running["id"]
    assert view(urgent["id"])["queue_position"] == 1
    assert view(q1["id"])["queue_position"] == 2
    assert view(q2["id"])["queue_position"] == 3
    # A selector job counts every queued job ahead of it.
    assert view(sel["id"])["queue_position"] == 4
    assert_error(rc.client.get("/v1/jobs/no-such-job"), 404, "not_found")


# ---- API-046: kill ----------------------------------------------------------------------


def test_kill_errors(rc: Harness) -> None:
    rc.register()
    job = rc.submit(device_id="gpubox:gpu0")
    url = f"/v1/jobs/{job['id']}/kill"
    assert_error(rc.client.post(url), 400, "bad_request")  # a JSON body is required
    assert_error(rc.client.post(url, content=b"  "), 400, "bad_request")
    assert_error(rc.client.post(url, content=b"{"), 400, "bad_request")
    assert_error(kill(rc, "no-such-job"), 404, "not_found")
    assert_error(kill(rc, job["id"], "bob"), 403, "not_job_owner")
    assert_error(kill(rc, job["id"], None), 403, "not_job_owner")
    assert_error(rc.worker.post(url, json={"submitter": "alice"}), 403, "forbidden")
    assert rc.job(job["id"])["state"] == "assigned"


def test_kill_a_queued_job(rc: Harness) -> None:
    rc.register()
    rc.submit(device_id="gpubox:gpu0")
    queued = rc.submit(device_id="gpubox:gpu0")
    rc.clock.advance(4)
    assert_empty_ok(kill(rc, queued["id"]))
    job = rc.job(queued["id"])
    assert job["state"] == "killed" and job["kill_reason"] == "killed by alice"
    assert job["finished_at"] == "2027-01-15T08:00:04Z"
    assert "started_at" not in job
    assert rc.client.get("/v1/state").json()["queued"] == []
    assert_error(kill(rc, queued["id"]), 409, "not_cancellable")


def test_admin_kill_override_reasons(rc: Harness) -> None:
    rc.register()
    rc.submit(device_id="gpubox:gpu0")
    a = rc.submit(device_id="gpubox:gpu0")
    b = rc.submit(device_id="gpubox:gpu0")
    assert_empty_ok(kill(rc, a["id"], "x", admin=True))
    assert rc.job(a["id"])["kill_reason"] == "killed by admin override (as x)"
    assert_empty_ok(kill(rc, b["id"], None, admin=True))
    assert rc.job(b["id"])["kill_reason"] == "killed by admin override"


def test_kill_a_running_job_requests_it(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    assert_empty_ok(kill(rc, job_id))
    job = rc.job(job_id)
    assert job["state"] == "running" and "kill_reason" not in job
    assert rc.poll(wid).json()["kills"] == [job_id]
    # The worker ends it with its own reason (STORE-043).
    assert_empty_ok(rc.report(job_id, wid, "killed", exit_code=-15, reason="killed by request"))
    assert rc.job(job_id)["kill_reason"] == "killed by request"
    assert_error(kill(rc, job_id), 409, "not_cancellable")


def test_kill_an_assigned_job(rc: Harness) -> None:
    wid = rc.register()
    job = rc.submit(device_id="gpubox:gpu0")
    assert_empty_ok(kill(rc, job["id"], "bob", admin=True))
    assert rc.job(job["id"])["state"] == "assigned"
    body = rc.poll(wid).json()
    assert [a["job_id"] for a in body["assignments"]] == [job["id"]]
    assert body["kills"] == [job["id"]]


def test_cancel_frees_the_queue_for_the_next_job(rc: Harness) -> None:
    # A cancelled queued job is never started, and the job behind it keeps its turn.
    first_id, wid = rc.running_job()
    doomed = rc.submit(device_id="gpubox:gpu0")
    nxt = rc.submit(device_id="gpubox:gpu0")
    assert_empty_ok(kill(rc, doomed["id"]))
    assert_empty_ok(rc.report(first_id, wid, "succeeded", exit_code=0))
    assert [a["job_id"] for a in rc.take(wid)] == [nxt["id"]]


# ---- API-047..049, LOG-003, EXT-FAST-2, EXT-CLI-5: logs ------------------------------------


def test_logs_follow_param(rc: Harness) -> None:
    job_id, _ = rc.running_job()
    url = f"/v1/jobs/{job_id}/logs"
    for bad in ["yes", "True", "FALSE", "1", "", "false "]:
        assert_error(rc.client.get(url, params={"follow": bad}), 400, "bad_request")
    r = rc.client.get(url + "?follow=false&follow=false")
    assert_error(r, 400, "bad_request")
    # Checked before the job is looked up.
    r = rc.client.get("/v1/jobs/no-such-job/logs", params={"follow": "maybe"})
    assert_error(r, 400, "bad_request")


def test_logs_snapshot(rc: Harness) -> None:
    job_id, _ = rc.running_job()
    url = f"/v1/jobs/{job_id}/logs"
    r = rc.client.get(url, params={"follow": "false"})
    assert r.status_code == 200 and r.content == b""  # no output yet: an empty 200
    payload = b"\x00\x01 out\r\n" + "ü".encode() + b"\xff"
    rc.append(job_id, payload[:5])
    rc.append(job_id, payload[5:])
    r = rc.client.get(url, params={"follow": "false"})
    assert r.status_code == 200
    assert r.content == payload
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.headers["x-content-type-options"] == "nosniff"
    # The snapshot never waits, even though the job is still running.
    assert rc.job(job_id)["state"] == "running"


def test_logs_of_unknown_job(rc: Harness) -> None:
    for params in [{"follow": "false"}, {"follow": "true"}, {}]:
        assert_error(rc.client.get("/v1/jobs/ghost/logs", params=params), 404, "not_found")
    assert rc.logged_jobs() == set()  # no log created


def test_logs_not_stored_for_attached_jobs(rc: Harness) -> None:
    # API-048 / API-100: 400 in both modes, never an empty stream.
    rc.register("gpubox", ("gpu0", "gpu1"))
    for device, stdio in [("gpubox:gpu0", "tty"), ("gpubox:gpu1", "pipe")]:
        job = rc.submit(device_id=device, stdio=stdio)
        for params in [{"follow": "false"}, {"follow": "true"}, {}]:
            r = rc.client.get(f"/v1/jobs/{job['id']}/logs", params=params)
            assert_error(r, 400, "logs_not_stored")


def test_follow_replays_then_streams_and_ends_on_the_terminal_report(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    rc.append(job_id, b"first\n")
    f = Follower(rc, job_id)
    kind, r, _ = f.next()
    assert kind == "headers" and r.status_code == 200
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert f.read_until(b"first\n") == b"first\n"  # replay from the first byte
    rc.append(job_id, b"second\x00")
    assert f.read_until(b"second\x00") == b"second\x00"
    rc.append(job_id, b"last")  # the worker's final chunk precedes its report (WRK-112)
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0))
    reported = time.monotonic()
    rest = b""
    while True:
        kind, value, at = f.next()
        if kind == "end":
            break
        rest += value
    assert rest == b"last"
    # EXT-FAST-2: ends on the state change itself, no 500 ms poll, no 200 ms linger.
    assert at - reported < 0.15, at - reported
    f.future.result(timeout=5)


def test_an_append_wakes_every_follower_of_the_job_at_once(
    rc: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LOG-004: one append notifies all current followers; with the periodic re-check out
    # of reach, only that wake-up can bring them the new bytes.
    monkeypatch.setattr(job_routes, "FOLLOW_RECHECK", 60.0)
    job_id, wid = rc.running_job()
    rc.append(job_id, b"before\n")
    followers = [Follower(rc, job_id), Follower(rc, job_id)]
    for f in followers:
        assert f.next()[0] == "headers"
        assert f.read_until(b"before\n") == b"before\n"  # replayed; now each waits
    rc.append(job_id, b"woken\n")
    for f in followers:
        assert f.read_until(b"woken\n", timeout=2) == b"woken\n"
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0))
    for f in followers:
        assert f.next()[0] == "end"


def test_follow_flushes_headers_before_any_output(rc: Harness) -> None:
    # LOG-003 step 1-2: a follower may attach before the first byte; headers come at once.
    rc.register()
    rc.submit(device_id="gpubox:gpu0")
    queued = rc.submit(device_id="gpubox:gpu0")  # nothing will run for a while
    started = time.monotonic()
    f = Follower(rc, queued["id"])
    kind, r, at = f.next(timeout=5)
    assert kind == "headers" and r.status_code == 200
    assert at - started < 0.5
    assert rc.stored_log(queued["id"]) == b""
    # Cancelling the queued job ends the follow at once (EXT-FAST-2).
    assert_empty_ok(kill(rc, queued["id"]))
    cancelled = time.monotonic()
    kind, _, at = f.next()
    assert kind == "end"
    assert at - cancelled < 0.15


def test_follow_of_a_finished_job_returns_everything_and_ends(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    rc.append(job_id, b"a" * 100_000)  # more than one 32 KiB chunk
    rc.append(job_id, b"tail")
    rc.report(job_id, wid, "failed", exit_code=1)
    rc.append(job_id, b"+late")  # stored after the end, shown by a later read (EXT-FAST-2)
    started = time.monotonic()
    r = rc.client.get(f"/v1/jobs/{job_id}/logs")
    assert time.monotonic() - started < 1
    assert r.status_code == 200
    assert r.content == b"a" * 100_000 + b"tail+late"
    r = rc.client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"})
    assert r.content == b"a" * 100_000 + b"tail+late"


def test_follow_ends_when_its_reader_disconnects(rc: Harness) -> None:
    # LOG-003 step 6: a client disconnect ends the follow and releases its task, even
    # while no output arrives and the job keeps running.
    job_id, _ = rc.running_job()
    rc.append(job_id, b"x")
    reader = rc.new_client("ctok")
    with reader.stream("GET", f"/v1/jobs/{job_id}/logs") as r:
        chunks = r.iter_raw()
        assert next(chunks) == b"x"
        rc.append(job_id, b"y")
        assert next(chunks) == b"y"  # still following
    reader.close()
    assert rc.wait_idle(), "the follow outlived its reader"
    assert rc.job(job_id)["state"] == "running"


def test_logs_offset(rc: Harness) -> None:
    # EXT-CLI-5: both modes start at the byte offset; anything but a byte count is 400.
    job_id, wid = rc.running_job()
    rc.append(job_id, b"0123456789")
    url = f"/v1/jobs/{job_id}/logs"
    assert rc.client.get(url, params={"follow": "false", "offset": "3"}).content == b"3456789"
    assert rc.client.get(url, params={"follow": "false", "offset": "0"}).content == b"0123456789"
    assert rc.client.get(url, params={"follow": "false", "offset": "99"}).content == b""
    for bad in ["-1", "abc", "", "1.5", "+1"]:
        r = rc.client.get(url, params={"follow": "false", "offset": bad})
        assert_error(r, 400, "bad_request")
    f = Follower(rc, job_id, offset="7")
    assert f.next()[0] == "headers"
    assert f.read_until(b"789") == b"789"
    rc.report(job_id, wid, "succeeded", exit_code=0)
    assert f.next()[0] == "end"


def test_unexpected_failures_are_generic_500s(rc: Harness, monkeypatch: Any) -> None:
    # API-003 / API-045: an infrastructure failure is 500 store_error with a generic
    # message: it leaks no driver text and never looks like "job not found".
    def broken(*_: Any) -> Any:
        raise RuntimeError("OperationalError: disk I/O error at /secret/rc.db")

    def store_down(*_: Any) -> Any:
        raise errors.StoreError("database error: OperationalError")

    monkeypatch.setattr(rc.svc.store.views, "list_jobs", broken)
    monkeypatch.setattr(rc.svc.store.queue, "job_view", store_down)
    msg = assert_error(rc.client.get("/v1/jobs"), 500, "store_error")
    assert "secret" not in msg and "OperationalError" not in msg
    # The answer is an ordinary response: the same keep-alive connection serves the next
    # request (the server must not reset it as if the application had crashed).
    assert_error(rc.client.get("/v1/jobs/some-id"), 500, "store_error")
    assert rc.client.get("/v1/whoami").json() == {"role": "client"}
    msg = assert_error(rc.client.get("/v1/jobs"), 500, "store_error")
    assert rc.client.get("/v1/devices").status_code == 200


# ---- API-051 / API-023: devices ---------------------------------------------------------


def test_devices_list(rc: Harness) -> None:
    assert rc.client.get("/v1/devices").json() == []
    wid = rc.register("zbox", ("gpu1", "gpu0"), labels={"gpu0": {"vram": "80G"}})
    rc.register("abox", ("gpu0",))
    views = rc.client.get("/v1/devices").json()
    assert [v["device"]["id"] for v in views] == ["abox:gpu0", "zbox:gpu0", "zbox:gpu1"]
    idle = views[2]
    assert idle == {
        "device": {
            "id": "zbox:gpu1",
            "host": "zbox",
            "name": "gpu1",
            "worker_id": wid,
            "state": "ready",
            "last_heartbeat_at": T0,
            "max_runtime_seconds": 0,  # EXT-CLI-6
        },
        "elapsed_seconds": 0,
        "heartbeat_age_seconds": 0,
    }
    rc.clock.advance(30)
    labelled = rc.client.get("/v1/devices").json()[1]
    assert labelled["oldest_label_age_seconds"] == 30
    assert labelled["heartbeat_age_seconds"] == 30
    assert labelled["device"]["labels"] == [
        {"key": "vram", "value": "80G", "source": "detected", "updated_at": T0}
    ]


def test_device_view_of_a_held_device(rc: Harness) -> None:
    job_id, _ = rc.running_job()
    rc.clock.advance(42)
    view = rc.device("gpubox:gpu0")
    assert view["holder"] == "alice" and view["job_id"] == job_id
    assert view["kind"] == "job" and view["command"] == ["python", "train.py"]
    assert view["elapsed_seconds"] == 42
    assert "reason" not in view and "quarantine_reason" not in view
    assert view["device"]["state"] == "busy"
    rc.register("holdbox", ("gpu0",))
    rc.submit(device_id="holdbox:gpu0", kind="hold", command=[], max_runtime_seconds=60, reason="x")
    hold = rc.device("holdbox:gpu0")
    assert hold["kind"] == "hold" and hold["reason"] == "x" and hold["command"] == ["hold"]


def test_ages_are_not_clamped(rc: Harness) -> None:
    # API-005: a timestamp in the controller's future yields a negative age.
    rc.register()
    rc.clock.advance(-10)
    assert rc.device("gpubox:gpu0")["heartbeat_age_seconds"] == -10


# ---- API-052: state ---------------------------------------------------------------------


def test_state_when_empty(rc: Harness) -> None:
    r = rc.client.get("/v1/state")
    assert r.status_code == 200
    assert r.json() == {"devices": [], "jobs": [], "queued": []}


def test_state_shapes_and_order(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1"))
    a = rc.submit(device_id="gpubox:gpu0")
    rc.clock.advance(1)
    b = rc.submit(device_id="gpubox:gpu1")
    rc.clock.advance(1)
    q_low = rc.submit(device_id="gpubox:gpu0")
    rc.clock.advance(1)
    q_high = rc.submit(device_id="gpubox:gpu1", priority=3)
    rc.clock.advance(1)
    q_low2 = rc.submit(device_id="gpubox:gpu0")
    rc.clock.advance(10)
    state = rc.client.get("/v1/state").json()
    assert [v["device"]["id"] for v in state["devices"]] == ["gpubox:gpu0", "gpubox:gpu1"]
    assert [j["id"] for j in state["jobs"]] == [b["id"], a["id"]]  # newest first
    # Scheduling order: priority descending, then enqueue order.
    assert [j["id"] for j in state["queued"]] == [q_high["id"], q_low["id"], q_low2["id"]]
    assert state["queued_waiting_seconds"] == {q_low["id"]: 12, q_high["id"]: 11, q_low2["id"]: 10}


# ---- API-060..063: describe ---------------------------------------------------------------


def test_describe_unknown_device(rc: Harness) -> None:
    assert_error(rc.client.get("/v1/devices/nohost:gpu0/describe"), 404, "not_found")


def test_describe_of_a_quarantined_device(rc: Harness) -> None:
    rc.register()
    rc.fault("gpubox:gpu0", "verify failed: pid 7 holds the card")
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["device"]["state"] == "unhealthy"
    assert d["quarantine_reason"] == "verify failed: pid 7 holds the card"


def test_describe_without_any_sheet(rc: Harness) -> None:
    rc.register()
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["sheet_updated_at"] == ZERO_INSTANT
    assert "sheet" not in d and "sheet_age_seconds" not in d
    # The device's own body is empty, so the (also empty) host-wide sheet stands in.
    assert d["sheet_is_host_wide"] is True
    assert "labels" not in d and "label_age_seconds" not in d and "recent_jobs" not in d
    assert d["elapsed_seconds"] == 0 and d["heartbeat_age_seconds"] == 0


def test_describe_sheet_choice(rc: Harness) -> None:
    # API-062 / API-063: the device's own sheet, else the host-wide one (flagged).
    wid = rc.register(
        "gpubox", ("gpu0", "gpu1", "gpu2"), sheet="# host\n", device_sheets={"gpu1": "# mine"}
    )
    rc.clock.advance(5)
    push = {"host": "gpubox", "devices": ["gpu2"], "device_sheets": {"gpu2": ""}}
    assert_empty_ok(rc.worker.post(f"/v1/workers/{wid}/labels", json=push))
    rc.clock.advance(5)

    def describe(device: str) -> dict[str, Any]:
        return dict(rc.client.get(f"/v1/devices/gpubox%3A{device}/describe").json())

    host_wide = describe("gpu0")
    assert host_wide["sheet"] == "# host\n" and host_wide["sheet_is_host_wide"] is True
    assert host_wide["sheet_updated_at"] == T0 and host_wide["sheet_age_seconds"] == 10
    own = describe("gpu1")
    assert own["sheet"] == "# mine" and "sheet_is_host_wide" not in own
    assert own["sheet_updated_at"] == T0 and own["sheet_age_seconds"] == 10
    # A device sheet stored as "" falls back to the host's too (the body decides).
    empty_own = describe("gpu2")
    assert empty_own["sheet"] == "# host\n" and empty_own["sheet_is_host_wide"] is True


def test_describe_keeps_a_device_sheet_that_later_registrations_do_not_name(
    rc: Harness,
) -> None:
    # STORE-153: a device's sheet is written only when its name is a key of
    # device_sheets; registrations and pushes listing the device without one leave it.
    wid = rc.register("gpubox", ("gpu0", "gpu1"), device_sheets={"gpu1": "# mine"})
    rc.clock.advance(5)
    rc.register("gpubox", ("gpu0", "gpu1"))
    rc.register("gpubox", ("gpu0", "gpu1"), device_sheets={})
    rc.register("gpubox", ("gpu0", "gpu1"), device_sheets={"gpu0": "# other"})
    push = {"host": "gpubox", "devices": ["gpu0", "gpu1"], "device_sheets": {}}
    assert_empty_ok(rc.worker.post(f"/v1/workers/{wid}/labels", json=push))
    d = rc.client.get("/v1/devices/gpubox:gpu1/describe").json()
    assert d["sheet"] == "# mine" and "sheet_is_host_wide" not in d
    assert d["sheet_updated_at"] == T0  # not rewritten since


def test_describe_host_sheet_replaced_by_empty(rc: Harness) -> None:
    # API-032: a present host sheet (even "") replaces the stored one; absent leaves it.
    # API-063: the shown row's time even when its body is empty; no age then.
    wid = rc.register(sheet="# host")
    url = f"/v1/workers/{wid}/labels"
    rc.clock.advance(5)
    assert_empty_ok(rc.worker.post(url, json={"host": "gpubox", "devices": ["gpu0"]}))
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["sheet"] == "# host" and d["sheet_updated_at"] == T0
    assert_empty_ok(rc.worker.post(url, json={"host": "gpubox", "devices": [], "sheet": ""}))
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert "sheet" not in d and "sheet_age_seconds" not in d
    assert d["sheet_updated_at"] == "2027-01-15T08:00:05Z"
    assert d["sheet_is_host_wide"] is True


def test_describe_labels_holder_and_recent_jobs(rc: Harness) -> None:
    wid = rc.register(
        "gpubox",
        ("gpu0",),
        labels={"gpu0": {"vram": "80G", "a/b": "1"}},
        declared_labels={"gpu0": {"vram": "40G"}},
    )
    made = []
    for _ in range(6):
        job = rc.submit(device_id="gpubox:gpu0")
        made.append(job["id"])
        rc.take(wid)
        rc.clock.advance(1)
        if len(made) < 6:
            rc.report(job["id"], wid, "succeeded", exit_code=0)
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["holder"] == "alice" and d["job_id"] == made[-1]
    assert d["elapsed_seconds"] == 1
    for absent in ["kind", "reason", "command", "oldest_label_age_seconds"]:
        assert absent not in d
    assert [(lb["key"], lb["source"]) for lb in d["labels"]] == [
        ("a/b", "detected"),
        ("vram", "declared"),
        ("vram", "detected"),
    ]
    assert d["label_age_seconds"] == {"a/b/detected": 6, "vram/declared": 6, "vram/detected": 6}
    assert [j["id"] for j in d["recent_jobs"]] == list(reversed(made))[:5]


# ---- API-064: explain -------------------------------------------------------------------


def test_explain(rc: Harness) -> None:
    labels = {"gpu0": {"vendor": "nvidia"}, "gpu1": {"vendor": "nvidia"}, "gpu2": {"vendor": "amd"}}
    rc.register("gpubox", ("gpu0", "gpu1", "gpu2"), labels=labels)
    assert_error(rc.client.get("/v1/explain"), 400, "bad_request")
    assert_error(rc.client.get("/v1/explain", params={"selector": ""}), 400, "bad_request")
    r = rc.client.get("/v1/explain", params={"selector": "vendor"})
    assert "vendor" in assert_error(r, 400, "bad_selector")

    rc.submit(device_id="gpubox:gpu0")  # gpu0 busy
    rc.submit(device_id="gpubox:gpu0")  # queued, pinned to a matching device
    rc.submit(selector="vendor=nvidia")  # placed on gpu1
    rc.submit(selector="vendor=nvidia")  # queued selector job: counted once
    rc.submit(device_id="gpubox:gpu2")  # amd: free? no, it takes gpu2
    rc.submit(device_id="gpubox:gpu2")  # queued on a device that does not match
    r = rc.client.get("/v1/explain", params={"selector": "vendor = nvidia"})
    assert r.status_code == 200
    assert r.json() == {
        "selector": "vendor = nvidia",
        "matching": ["gpubox:gpu0", "gpubox:gpu1"],
        "free": [],
        "queue_depth": 2,
    }
    none = rc.client.get("/v1/explain", params={"selector": "vendor=intel"}).json()
    hint = none.pop("hint")  # nothing matches: what the devices have for the key
    assert none == {"selector": "vendor=intel", "matching": [], "free": [], "queue_depth": 0}
    assert hint.startswith("vendor has ") and "'nvidia' (2 devices)" in hint, hint
    assert len(rc.client.get("/v1/jobs").json()["jobs"]) == 6  # explain submits nothing


def test_explain_free_devices(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1"), labels={"gpu0": {"v": "1"}, "gpu1": {"v": "1"}})
    rc.submit(device_id="gpubox:gpu1")
    out = rc.client.get("/v1/explain", params={"selector": "v=1"}).json()
    assert out["matching"] == ["gpubox:gpu0", "gpubox:gpu1"]
    assert out["free"] == ["gpubox:gpu0"]


# ---- API-070: whoami ----------------------------------------------------------------------


def test_whoami(rc: Harness) -> None:
    assert rc.client.get("/v1/whoami").json() == {"role": "client"}
    assert rc.admin.get("/v1/whoami").json() == {"role": "admin"}
    assert_error(rc.worker.get("/v1/whoami"), 403, "forbidden")


# ---- API-080: clear -----------------------------------------------------------------------


def test_clear_refusals(rc: Harness) -> None:
    # API-080 / API-103: unknown, not unhealthy, or leased → 409 device_not_cleared.
    job_id, wid = rc.running_job()
    assert_error(rc.admin.post("/v1/devices/nohost:gpu0/clear"), 409, "device_not_cleared")
    assert_error(rc.admin.post("/v1/devices/gpubox:gpu0/clear"), 409, "device_not_cleared")  # busy
    rc.fault("gpubox:gpu0")
    msg = assert_error(rc.admin.post("/v1/devices/gpubox:gpu0/clear"), 409, "device_not_cleared")
    assert "lease" in msg
    assert rc.device("gpubox:gpu0")["device"]["state"] == "unhealthy"
    # Once the job ends the quarantine can be lifted.
    rc.report(job_id, wid, "succeeded", exit_code=0)
    assert_empty_ok(rc.admin.post("/v1/devices/gpubox:gpu0/clear"))
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "ready" and "quarantine_reason" not in view
    assert_error(rc.admin.post("/v1/devices/gpubox:gpu0/clear"), 409, "device_not_cleared")


def test_clear_places_a_waiting_job_at_once(rc: Harness) -> None:
    # EXT-FAST-1: a cleared device takes the job waiting for it without the periodic pass.
    wid = rc.register()
    rc.fault("gpubox:gpu0", "ECC errors")
    waiting = rc.submit(device_id="gpubox:gpu0")
    assert waiting["state"] == "queued"
    poll = rc.background(rc.poll, wid, wait="20s")
    time.sleep(0.2)
    assert_empty_ok(rc.admin.post("/v1/devices/gpubox%3Agpu0/clear"))
    cleared = time.monotonic()
    r = poll.result(timeout=5)
    assert time.monotonic() - cleared < 0.5
    assert [a["job_id"] for a in r.json()["assignments"]] == [waiting["id"]]


# ---- API-081: retire ----------------------------------------------------------------------


def test_retire(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    r = rc.admin.delete("/v1/devices/nohost:gpu0")
    assert assert_error(r, 404, "device_not_found") == "no such device: nohost:gpu0"
    msg = assert_error(rc.admin.delete("/v1/devices/gpubox:gpu0"), 409, "device_busy")
    assert "kill" in msg or "release" in msg
    rc.report(job_id, wid, "succeeded", exit_code=0)
    r = rc.admin.delete("/v1/devices/gpubox%3Agpu0")
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"retired", "note"} and body["retired"] == "gpubox:gpu0"
    assert "regist" in body["note"]
    assert rc.client.get("/v1/devices").json() == []
    assert_error(rc.client.get("/v1/devices/gpubox:gpu0/describe"), 404, "not_found")
    # Job history is kept.
    assert rc.job(job_id)["state"] == "succeeded"
    assert [
        j["id"] for j in rc.client.get("/v1/jobs", params={"device": "gpubox:gpu0"}).json()["jobs"]
    ] == [job_id]
    assert_error(rc.admin.delete("/v1/devices/gpubox:gpu0"), 404, "device_not_found")
    # A worker that still declares it brings it back.
    rc.register()
    assert rc.device("gpubox:gpu0")["device"]["state"] == "ready"


# ---- API-009, LOG-002, STORE-162 --------------------------------------------------------


def test_a_follow_silent_for_longer_than_any_idle_timeout_still_streams(rc: Harness) -> None:
    # API-009: no server-wide read, write or idle timeout cuts a follow that has been
    # silent for over 6 s (uvicorn's own defaults are 5 s); the next chunk comes on the
    # same stream.
    job_id, wid = rc.running_job()
    rc.append(job_id, b"before\n")
    f = Follower(rc, job_id)
    assert f.next()[0] == "headers"
    assert f.read_until(b"before\n") == b"before\n"
    with pytest.raises(queue.Empty):
        f.next(timeout=6.5)  # neither an end nor an error while nothing is written
    rc.append(job_id, b"after\n")
    assert f.read_until(b"after\n") == b"after\n"
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0))
    assert f.next()[0] == "end"


def test_a_jobs_log_outlives_its_retired_device(rc: Harness) -> None:
    # LOG-002: nothing is deleted when the job's device is retired.
    job_id, wid = rc.running_job()
    rc.append(job_id, b"epoch 1\n")
    rc.append(job_id, b"epoch 2\n")
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0))
    assert rc.admin.delete("/v1/devices/gpubox:gpu0").status_code == 200
    assert rc.client.get("/v1/devices").json() == []
    for params in [{"follow": "false"}, {}]:
        r = rc.client.get(f"/v1/jobs/{job_id}/logs", params=params)
        assert (r.status_code, r.content) == (200, b"epoch 1\nepoch 2\n")
    assert rc.stored_log(job_id) == b"epoch 1\nepoch 2\n"


def test_describe_recent_jobs_include_a_queued_job_pinned_to_the_device(rc: Harness) -> None:
    # STORE-162: the 5 most recent jobs with the device's ID, newest first, a queued one
    # pinned to it among them; another device's jobs are not.
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    made = []
    for _ in range(5):
        job = rc.submit(device_id="gpubox:gpu0")
        made.append(job["id"])
        rc.take(wid)
        rc.clock.advance(1)
        assert_empty_ok(rc.report(job["id"], wid, "succeeded", exit_code=0))
    made.append(rc.submit(device_id="gpubox:gpu0")["id"])  # runs
    rc.clock.advance(1)
    queued = rc.submit(device_id="gpubox:gpu0")
    assert queued["state"] == "queued"
    made.append(queued["id"])
    rc.clock.advance(1)
    rc.submit(device_id="gpubox:gpu1")  # the newest job, elsewhere
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert [j["id"] for j in d["recent_jobs"]] == list(reversed(made))[:5]
    assert [j["state"] for j in d["recent_jobs"][:2]] == ["queued", "assigned"]
