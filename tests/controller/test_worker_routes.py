"""Worker routes (controller-api.md §6): register, labels, long poll, heartbeat, logs, status."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from controller_harness import Harness, assert_empty_ok, assert_error

from resource_controller.controller.routes.workers import parse_wait

REGISTER = "/v1/workers/register"


# ---- API-030 / API-031: register --------------------------------------------------------


def test_register_answers_the_uuid5_of_the_host(rc: Harness) -> None:
    r = rc.worker.post(REGISTER, json={"host": "gpubox", "devices": [{"name": "gpu0"}]})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"worker_id": str(uuid.uuid5(uuid.NAMESPACE_DNS, "gpubox"))}
    # Deterministic: the same host always gets the same ID.
    assert rc.register("gpubox") == r.json()["worker_id"]


def test_register_declares_devices(rc: Harness) -> None:
    wid = rc.register("gpubox", ({"name": "gpu1"}, {"name": "gpu0", "max_runtime_seconds": 3600}))
    views = rc.client.get("/v1/devices").json()
    assert [v["device"]["id"] for v in views] == ["gpubox:gpu0", "gpubox:gpu1"]
    dev = views[0]["device"]
    assert dev["host"] == "gpubox" and dev["name"] == "gpu0"
    assert dev["worker_id"] == wid and dev["state"] == "ready"


def test_register_with_no_devices(rc: Harness) -> None:
    rc.register("empty", ())
    assert rc.client.get("/v1/devices").json() == []


def test_register_sets_and_clears_the_runtime_ceiling(rc: Harness) -> None:
    # API-031 step 5: negative means 0, absent writes 0, so removing a ceiling clears it.
    rc.register("gpubox", ({"name": "gpu0", "max_runtime_seconds": 100},))
    job = rc.submit(device_id="gpubox:gpu0")  # inherits the ceiling (API-042)
    assert job["max_runtime_seconds"] == 100
    rc.report(job["id"], job["worker_id"], "succeeded", exit_code=0)
    assert_error(
        rc.submit_raw(device_id="gpubox:gpu0", max_runtime_seconds=101),
        400,
        "runtime_above_ceiling",
    )
    # EXT-LIMITS-1: a negative ceiling is refused, naming the field (no longer read as 0).
    body = {"host": "gpubox", "devices": [{"name": "gpu0", "max_runtime_seconds": -5}]}
    r = rc.worker.post(REGISTER, json=body)
    assert "devices.0.max_runtime_seconds" in assert_error(r, 400, "bad_request")
    rc.register("gpubox", ({"name": "gpu0", "max_runtime_seconds": 0},))
    assert rc.submit(device_id="gpubox:gpu0", max_runtime_seconds=10_000)["state"] == "assigned"


def test_register_empty_host_is_400(rc: Harness) -> None:
    for body in [{"host": ""}, {}, {"devices": [{"name": "gpu0"}]}]:
        assert_error(rc.worker.post(REGISTER, json=body), 400, "bad_request")
    assert rc.client.get("/v1/devices").json() == []


def test_register_bad_json_is_400(rc: Harness) -> None:
    assert_error(rc.worker.post(REGISTER, content=b'{"host": '), 400, "bad_request")


def test_register_sheet_limits(rc: Harness) -> None:
    # API-031 step 2: 65536 bytes (UTF-8 encoded) is accepted, one more is 413 and
    # nothing at all is stored; the message names host or device.
    body = {"host": "big", "devices": [{"name": "gpu0"}]}
    r = rc.worker.post(REGISTER, json={**body, "sheet": "x" * 65537})
    assert "host" in assert_error(r, 413, "sheet_too_large")
    r = rc.worker.post(REGISTER, json={**body, "device_sheets": {"gpu0": "é" * 32769}})
    assert "gpu0" in assert_error(r, 413, "sheet_too_large")
    assert rc.client.get("/v1/devices").json() == []  # nothing stored
    assert rc.client.get("/v1/devices/big:gpu0/describe").status_code == 404

    ok = {**body, "sheet": "x" * 65536, "device_sheets": {"gpu0": "é" * 32768}}
    assert rc.worker.post(REGISTER, json=ok).status_code == 200
    d = rc.client.get("/v1/devices/big:gpu0/describe").json()
    assert d["sheet"] == "é" * 32768


def test_register_stores_labels_and_sheets(rc: Harness) -> None:
    # API-032: host-wide facts merged under each named device; the device wins a collision.
    rc.register(
        "gpubox",
        ("gpu0", "gpu1"),
        labels={"": {"cpus": "64", "vendor": "x"}, "gpu0": {"vendor": "nvidia"}},
        declared_labels={"gpu1": {"rack": "r3"}},
        sheet="# host",
    )
    labels0 = {
        (lb["key"], lb["source"]): lb["value"]
        for lb in rc.device("gpubox:gpu0")["device"]["labels"]
    }
    assert labels0 == {("cpus", "detected"): "64", ("vendor", "detected"): "nvidia"}
    dev1 = rc.device("gpubox:gpu1")["device"]
    assert [(lb["key"], lb["source"]) for lb in dev1["labels"]] == [("rack", "declared")]


def test_reregistration_reaps_in_flight_jobs(rc: Harness) -> None:
    # API-031 step 4: registration means "a fresh process with nothing running".
    job_id, wid = rc.running_job()
    assert rc.register("gpubox") == wid
    job = rc.job(job_id)
    assert job["state"] == "lost" and "finished_at" in job
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "unhealthy"
    assert view["quarantine_reason"] == "registration"
    assert "job_id" not in view


# ---- API-033: labels push ---------------------------------------------------------------


def test_labels_push(rc: Harness) -> None:
    wid = rc.register("gpubox", ("gpu0", "gpu1"), labels={"gpu0": {"a": "1"}, "gpu1": {"b": "2"}})
    r = rc.worker.post(
        f"/v1/workers/{wid}/labels",
        json={"host": "gpubox", "devices": ["gpu0", "gpu1"], "labels": {"gpu0": {"a": "9"}}},
    )
    assert_empty_ok(r)
    assert [(lb["key"], lb["value"]) for lb in rc.device("gpubox:gpu0")["device"]["labels"]] == [
        ("a", "9")
    ]
    # gpu1 is not a key of "labels": its stored labels stay (API-032).
    assert [(lb["key"], lb["value"]) for lb in rc.device("gpubox:gpu1")["device"]["labels"]] == [
        ("b", "2")
    ]
    # labels absent: nothing is touched; an empty device map empties it.
    r = rc.worker.post(f"/v1/workers/{wid}/labels", json={"host": "gpubox", "devices": ["gpu0"]})
    assert_empty_ok(r)
    assert rc.device("gpubox:gpu0")["device"]["labels"][0]["value"] == "9"
    r = rc.worker.post(
        f"/v1/workers/{wid}/labels",
        json={"host": "gpubox", "devices": ["gpu0"], "labels": {"gpu0": {}}},
    )
    assert_empty_ok(r)
    assert "labels" not in rc.device("gpubox:gpu0")["device"]


def test_labels_push_errors(rc: Harness) -> None:
    wid = rc.register("gpubox")
    url = f"/v1/workers/{wid}/labels"
    assert_error(rc.worker.post(url, json={"host": "", "devices": []}), 400, "bad_request")
    assert_error(rc.worker.post(url, content=b"{"), 400, "bad_request")
    unknown = str(uuid.uuid4())
    r = rc.worker.post(f"/v1/workers/{unknown}/labels", json={"host": "gpubox", "devices": []})
    assert_error(r, 404, "not_found")
    msg = assert_error(
        rc.worker.post(url, json={"host": "other", "devices": []}), 400, "bad_request"
    )
    assert "other" in msg
    r = rc.worker.post(
        url, json={"host": "gpubox", "devices": ["gpu0"], "device_sheets": {"gpu0": "y" * 65537}}
    )
    assert "gpu0" in assert_error(r, 413, "sheet_too_large")
    r = rc.worker.post(url, json={"host": "gpubox", "devices": ["gpu0"], "sheet": "y" * 65537})
    assert_error(r, 413, "sheet_too_large")
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert "sheet" not in d  # nothing stored


def test_labels_push_never_touches_jobs_or_devices(rc: Harness) -> None:
    # API-033: a push is not a registration; it must not reap the worker's running job.
    job_id, wid = rc.running_job()
    r = rc.worker.post(
        f"/v1/workers/{wid}/labels",
        json={"host": "gpubox", "devices": ["gpu0"], "labels": {"gpu0": {"a": "1"}}},
    )
    assert_empty_ok(r)
    assert rc.job(job_id)["state"] == "running"
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "busy" and view["job_id"] == job_id


# ---- API-035: heartbeat -----------------------------------------------------------------


def test_heartbeat_bodies(rc: Harness) -> None:
    wid = rc.register()
    url = f"/v1/workers/{wid}/heartbeat"
    assert_empty_ok(rc.worker.post(url))
    assert_empty_ok(rc.worker.post(url, content=b"   \n\t"))
    assert_empty_ok(rc.worker.post(url, json={}))
    assert_empty_ok(rc.worker.post(url, json={"running_job_ids": []}))
    assert_empty_ok(rc.worker.post("/v1/workers/nobody/heartbeat"))  # unknown worker: fine
    assert_error(rc.worker.post(url, content=b"{running"), 400, "bad_request")
    # 65536 bytes is the limit: a padded valid body at the limit passes, one more byte is 413.
    padded = b'{"running_job_ids": []}'
    at_limit = padded + b" " * (65536 - len(padded))
    assert_empty_ok(rc.worker.post(url, content=at_limit))
    assert_error(rc.worker.post(url, content=at_limit + b" "), 413, "body_too_large")


def test_heartbeat_refreshes_the_clock_and_renews_named_jobs(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    rc.clock.advance(20)
    assert rc.device("gpubox:gpu0")["heartbeat_age_seconds"] == 20
    r = rc.worker.post(f"/v1/workers/{wid}/heartbeat", json={"running_job_ids": [job_id]})
    assert_empty_ok(r)
    assert rc.device("gpubox:gpu0")["heartbeat_age_seconds"] == 0


# ---- API-034: assignments long poll -----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("30s", 30.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("1m", 60.0),
        ("60s", 60.0),
        ("250000us", 0.25),
        ("250000µs", 0.25),
        ("1s500ms", 1.5),
        ("+2s", 2.0),
        # Anything else silently means 30 s.
        (None, 30.0),
        ("", 30.0),
        ("abc", 30.0),
        ("5", 30.0),
        ("0", 30.0),
        ("0s", 30.0),
        ("-1s", 30.0),
        ("61s", 30.0),
        ("1m1ms", 30.0),
        ("1h", 30.0),
        ("2 s", 30.0),
        ("1d", 30.0),
    ],
)
def test_parse_wait(raw: str | None, seconds: float) -> None:
    assert parse_wait(raw) == pytest.approx(seconds)


def test_poll_times_out_with_204_after_the_wait(rc: Harness) -> None:
    wid = rc.register()
    started = time.monotonic()
    r = rc.poll(wid, wait="300ms")
    elapsed = time.monotonic() - started
    assert r.status_code == 204 and r.content == b""
    assert 0.25 <= elapsed < 1.5
    # An unknown worker ID is not validated; it simply never has work.
    assert rc.poll("no-such-worker", wait="10ms").status_code == 204


def test_poll_with_a_bad_wait_waits_long_and_a_submit_wakes_it(rc: Harness) -> None:
    # API-034: "0s" is not honoured (it means 30 s), so the poll is still parked after
    # 0.5 s; a submit that assigns this worker a job wakes it at once with the job.
    wid = rc.register()
    poll = rc.background(rc.poll, wid, wait="0s")
    time.sleep(0.5)
    assert not poll.done()
    rc.clock.advance(7)
    job = rc.submit(device_id="gpubox:gpu0", cwd="/src", env={"A": "1"}, idle_timeout_seconds=60)
    woken_after = time.monotonic()
    r = poll.result(timeout=5)
    assert time.monotonic() - woken_after < 0.5
    assert r.status_code == 200
    body = r.json()
    assert "kills" not in body
    [a] = body["assignments"]
    assert a["job_id"] == job["id"] and a["device_id"] == "gpubox:gpu0"
    assert a["command"] == ["python", "train.py"]
    assert a["cwd"] == "/src" and a["env"] == {"A": "1"} and a["idle_timeout_seconds"] == 60
    assert a["submitter"] == "alice" and a["kind"] == "job"
    assert isinstance(a["lease_epoch"], int) and a["lease_epoch"] > 0  # EXT-EPOCH-3a
    assert a["lease_epoch"] == rc.job(job["id"])["lease_epoch"]
    assert "stdio" not in a and "max_runtime_seconds" not in a


def test_hand_out_starts_the_job_once(rc: Harness) -> None:
    # API-034: assigned -> running with started_at = now before the answer; never twice.
    wid = rc.register()
    job = rc.submit(device_id="gpubox:gpu0")
    assert job["state"] == "assigned" and "started_at" not in job
    rc.clock.advance(5)
    [a] = rc.take(wid)
    assert a["job_id"] == job["id"]
    assert "cwd" not in a and "env" not in a and "idle_timeout_seconds" not in a
    started = rc.job(job["id"])
    assert started["state"] == "running"
    assert started["started_at"] == "2027-01-15T08:00:05Z"
    assert rc.poll(wid, wait="50ms").status_code == 204  # not handed out again
    # The worker's own later "running" report is a harmless no-op.
    assert_empty_ok(rc.report(job["id"], wid, "running"))
    assert rc.job(job["id"])["started_at"] == "2027-01-15T08:00:05Z"


def test_assignment_of_a_tty_job_and_a_hold(rc: Harness) -> None:
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    tty = rc.submit(device_id="gpubox:gpu0", stdio="tty", max_runtime_seconds=60)
    hold = rc.submit(
        device_id="gpubox:gpu1", kind="hold", command=[], max_runtime_seconds=600, reason="debug"
    )
    by_id = {a["job_id"]: a for a in rc.take(wid)}
    assert by_id[tty["id"]]["stdio"] == "tty"
    assert by_id[tty["id"]]["max_runtime_seconds"] == 60
    assert by_id[hold["id"]]["kind"] == "hold"
    assert by_id[hold["id"]]["command"] == ["hold"]


def test_kill_wakes_the_poll_with_kills(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    poll = rc.background(rc.poll, wid, wait="20s")
    time.sleep(0.2)
    assert not poll.done()
    assert_empty_ok(rc.client.post(f"/v1/jobs/{job_id}/kill", json={"submitter": "alice"}))
    killed_at = time.monotonic()
    r = poll.result(timeout=5)
    assert time.monotonic() - killed_at < 0.5
    assert r.status_code == 200
    assert r.json() == {"assignments": [], "kills": [job_id]}
    assert rc.job(job_id)["state"] == "running"  # the worker reports the outcome later


def test_kill_redelivery_waits_30_seconds(rc: Harness) -> None:
    # API-034 / STORE-094: a take; re-offered only after 30 s, or at once on a new kill.
    job_id, wid = rc.running_job()
    assert rc.client.post(f"/v1/jobs/{job_id}/kill", json={"submitter": "alice"}).status_code == 200
    assert rc.poll(wid).json()["kills"] == [job_id]
    assert rc.poll(wid, wait="50ms").status_code == 204
    rc.clock.advance(29)
    assert rc.poll(wid, wait="50ms").status_code == 204
    rc.clock.advance(1)
    assert rc.poll(wid, wait="50ms").json()["kills"] == [job_id]
    assert rc.poll(wid, wait="50ms").status_code == 204
    # A new kill request re-arms delivery immediately.
    assert rc.client.post(f"/v1/jobs/{job_id}/kill", json={"submitter": "alice"}).status_code == 200
    assert rc.poll(wid, wait="50ms").json()["kills"] == [job_id]


def test_concurrent_polls_never_start_a_job_twice(rc: Harness) -> None:
    # API-034: every concurrent poll is woken; exactly one of them gets the job.
    wid = rc.register()
    polls = [rc.background(rc.poll, wid, wait="1s", client=rc.new_client("wtok")) for _ in range(3)]
    time.sleep(0.2)
    job = rc.submit(device_id="gpubox:gpu0")
    answers = [p.result(timeout=5) for p in polls]
    got = [r for r in answers if r.status_code == 200]
    assert len(got) == 1, [r.status_code for r in answers]
    assert [a["job_id"] for a in got[0].json()["assignments"]] == [job["id"]]


def test_a_poll_whose_client_left_takes_nothing(rc: Harness) -> None:
    # API-034: a disconnected poll stops without answering, so it must not start a job
    # that nobody will receive.
    wid = rc.register()
    impatient = rc.new_client("wtok", timeout=httpx.Timeout(15, read=0.3))
    gone = rc.background(rc.poll, wid, wait="20s", client=impatient)
    with pytest.raises(httpx.ReadTimeout):
        gone.result(timeout=5)
    assert rc.wait_idle(), "the poll outlived its client"
    job = rc.submit(device_id="gpubox:gpu0")
    assert [a["job_id"] for a in rc.take(wid)] == [job["id"]]


def test_registration_places_a_waiting_job_at_once(rc: Harness) -> None:
    # EXT-FAST-1: a worker's registration can make a queued job placeable; it is placed
    # right away, not at the next periodic pass (30 s here).
    rc.register("gpubox", ("gpu0",))
    rc.submit()
    waiting = rc.submit()  # any device: none free
    assert waiting["state"] == "queued"
    wid = rc.register("newbox", ("gpu0",))
    deadline = time.monotonic() + 0.5
    while rc.job(waiting["id"])["state"] == "queued" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [a["job_id"] for a in rc.take(wid)] == [waiting["id"]]
    assert rc.job(waiting["id"])["device_id"] == "newbox:gpu0"


# ---- API-036: log append ----------------------------------------------------------------


def test_log_append_is_verbatim(rc: Harness) -> None:
    job_id, _ = rc.running_job()
    chunks = [b"\x00\xffbinary\r\n", b"", "héllo\n".encode(), b"\x1b[31mred\x1b[0m"]
    for chunk in chunks:
        assert_empty_ok(rc.append(job_id, chunk))
    stored = b"".join(chunks)
    assert rc.stored_log(job_id) == stored
    assert rc.client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "false"}).content == stored


def test_log_append_limits_and_errors(rc: Harness) -> None:
    job_id, _ = rc.running_job()
    assert_empty_ok(rc.append(job_id, b"a" * (1024 * 1024)))
    assert_error(rc.append(job_id, b"b" * (1024 * 1024 + 1)), 413, "chunk_too_large")
    assert rc.stored_log(job_id) == b"a" * (1024 * 1024)  # nothing of the refused chunk
    # The job's existence is not checked; a name outside [A-Za-z0-9._-] is a log error.
    assert_empty_ok(rc.append("not-a-known-job_1.2", b"x"))
    for bad in ["a%20b", "a$b", "caf%C3%A9", "a%3Ab", "%2E%2E", "%2E"]:
        r = rc.worker.post(f"/v1/jobs/{bad}/logs", content=b"x")
        assert_error(r, 500, "log_error")
    assert rc.logged_jobs() == {job_id, "not-a-known-job_1.2"}


def test_log_append_lease_epoch(rc: Harness) -> None:
    # EXT-EPOCH-3/3a: ?lease_epoch= must be the job's current epoch; absent is accepted.
    job_id, _ = rc.running_job()
    epoch = rc.job(job_id)["lease_epoch"]
    assert_empty_ok(rc.append(job_id, b"1", lease_epoch=str(epoch)))
    assert_error(rc.append(job_id, b"2", lease_epoch=str(epoch + 1)), 409, "stale_lease")
    assert_error(rc.append(job_id, b"3", lease_epoch="0"), 409, "stale_lease")
    assert_empty_ok(rc.append(job_id, b"4"))
    assert rc.stored_log(job_id) == b"14"


# ---- API-037 / API-038: status ----------------------------------------------------------


def test_status_errors(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    url = f"/v1/jobs/{job_id}/status"
    assert_error(rc.worker.post(url, content=b"{bad"), 400, "bad_request")
    assert_error(rc.report("no-such-job", wid, "succeeded"), 404, "not_found")
    other = str(uuid.uuid5(uuid.NAMESPACE_DNS, "otherbox"))
    assert_error(rc.report(job_id, other, "succeeded"), 403, "not_job_owner")
    assert_error(rc.report(job_id, "", "succeeded"), 403, "not_job_owner")
    assert_error(rc.worker.post(url, json={"state": "failed"}), 403, "not_job_owner")
    for state in ["queued", "assigned", "done", "", "RUNNING"]:
        assert_error(rc.report(job_id, wid, state), 400, "bad_request")
    job = rc.job(job_id)
    assert job["state"] == "running"
    assert rc.device("gpubox:gpu0")["device"]["state"] == "busy"


def test_status_running_moves_an_assigned_job(rc: Harness) -> None:
    # API-038 step 4: assigned -> running (started_at set); no-op otherwise.
    wid = rc.register()
    job = rc.submit(device_id="gpubox:gpu0")
    rc.clock.advance(3)
    assert_empty_ok(rc.report(job["id"], wid, "running"))
    got = rc.job(job["id"])
    assert got["state"] == "running" and got["started_at"] == "2027-01-15T08:00:03Z"
    assert rc.poll(wid, wait="50ms").status_code == 204  # no longer "assigned": not handed out


def test_terminal_report_releases_the_device(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    rc.clock.advance(9)
    r = rc.report(job_id, wid, "failed", exit_code=3, reason="exit status 3")
    assert_empty_ok(r)
    job = rc.job(job_id)
    assert job["state"] == "failed" and job["exit_code"] == 3
    assert job["kill_reason"] == "exit status 3"
    assert job["finished_at"] == "2027-01-15T08:00:09Z"
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "ready"
    assert "job_id" not in view and "holder" not in view and view["elapsed_seconds"] == 0
    # A repeated (or different) terminal report is a silent success that changes nothing.
    rc.clock.advance(5)
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0))
    assert rc.job(job_id) == job
    # "running" after the end is a no-op too.
    assert_empty_ok(rc.report(job_id, wid, "running"))
    assert rc.job(job_id) == job


def test_terminal_report_keeps_a_faulted_device_out(rc: Harness) -> None:
    # API-038 step 6: an unhealthy device stays out after the release.
    job_id, wid = rc.running_job()
    rc.fault("gpubox:gpu0")
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0))
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "unhealthy"
    assert view["quarantine_reason"] == "verify failed: leftover pid 42"


def test_release_assigns_the_next_job_at_once(rc: Harness) -> None:
    # EXT-FAST-1: the job queued behind a finished one is assigned right after the terminal
    # report, without waiting for the periodic pass (stretched to 30 s in these tests),
    # and the worker's waiting poll gets it.
    first_id, wid = rc.running_job()
    second = rc.submit(device_id="gpubox:gpu0")
    assert second["state"] == "queued"
    poll = rc.background(rc.poll, wid, wait="20s")
    time.sleep(0.2)
    assert not poll.done()
    assert_empty_ok(rc.report(first_id, wid, "succeeded", exit_code=0))
    released_at = time.monotonic()
    r = poll.result(timeout=5)
    assert time.monotonic() - released_at < 0.5
    assert [a["job_id"] for a in r.json()["assignments"]] == [second["id"]]
    assert rc.job(second["id"])["state"] == "running"


def test_status_lease_epoch(rc: Harness) -> None:
    # EXT-EPOCH-3: a report naming an old epoch is refused and changes nothing.
    job_id, wid = rc.running_job()
    epoch = rc.job(job_id)["lease_epoch"]
    assert_error(
        rc.report(job_id, wid, "succeeded", exit_code=0, lease_epoch=epoch + 1), 409, "stale_lease"
    )
    assert_error(
        rc.report(job_id, wid, "succeeded", exit_code=0, lease_epoch=epoch - 1), 409, "stale_lease"
    )
    assert rc.job(job_id)["state"] == "running"
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0, lease_epoch=epoch))
    assert rc.job(job_id)["state"] == "succeeded"


def test_fault(rc: Harness) -> None:
    # API-039: required reason; unknown device 404; the detail is shown as the reason.
    rc.register()
    assert_error(rc.worker.post("/v1/devices/gpubox:gpu0/fault", json={}), 400, "bad_request")
    r = rc.worker.post("/v1/devices/nohost:gpu9/fault", json={"reason": "x"})
    assert_error(r, 404, "not_found")
    assert_empty_ok(rc.worker.post("/v1/devices/gpubox%3Agpu0/fault", json={"reason": "ECC"}))
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "unhealthy" and view["quarantine_reason"] == "ECC"
