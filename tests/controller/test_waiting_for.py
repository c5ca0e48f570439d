"""What a queued job waits for, on a live controller (EXT-WHY-1, EXT-WHY-1a, EXT-WHY-2)."""

from __future__ import annotations

from typing import Any

from controller_harness import Harness, assert_error

T0 = "2027-01-15T08:00:00Z"  #: the fake clock's start
T0_PLUS_600 = "2027-01-15T08:10:00Z"


def view(rc: Harness, job_id: str) -> dict[str, Any]:
    r = rc.client.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def hold(rc: Harness, device: str, who: str = "bob", ttl: int = 600) -> str:
    body = {"kind": "hold", "command": [], "max_runtime_seconds": ttl, "reason": "profiling"}
    h = rc.submit(device_id=device, submitter=who, **body)
    assert h["state"] == "assigned", h
    return str(h["id"])


def test_behind_a_hold_names_holder_kind_reason_since_and_until(rc: Harness) -> None:
    # EXT-WHY-1a: a held device names the holder, its job, kind, since and until (the
    # hold's TTL counted from the grant); the hold's reason rides along.
    wid = rc.register("gpubox", ("gpu0",))
    hold_id = hold(rc, "gpubox:gpu0")
    rc.take(wid)
    rc.clock.advance(30)
    queued = rc.submit(device_id="gpubox:gpu0")
    assert queued["state"] == "queued"
    got = view(rc, queued["id"])
    assert got["queue_position"] == 1
    assert got["waiting_for"] == [
        {
            "device_id": "gpubox:gpu0",
            "holder": "bob",
            "job_id": hold_id,
            "kind": "hold",
            "reason": "profiling",
            "since": T0,
            "until": T0_PLUS_600,
        }
    ]
    # Not queued: both keys are omitted.
    held = view(rc, hold_id)
    assert "waiting_for" not in held and "queue_position" not in held


def test_a_holder_without_a_runtime_has_no_until(rc: Harness) -> None:
    wid = rc.register("gpubox", ("gpu0",))
    first = rc.submit(device_id="gpubox:gpu0", submitter="carol")
    rc.take(wid)
    queued = rc.submit(device_id="gpubox:gpu0")
    (entry,) = view(rc, queued["id"])["waiting_for"]
    assert entry == {
        "device_id": "gpubox:gpu0",
        "holder": "carol",
        "job_id": first["id"],
        "kind": "job",
        "since": T0,
    }


def test_a_device_ceiling_is_the_holders_limit(rc: Harness) -> None:
    # A job that asked for no runtime inherits the device's ceiling (STORE-065 step 3).
    wid = rc.register("gpubox", ({"name": "gpu0", "max_runtime_seconds": 600},))
    rc.submit(device_id="gpubox:gpu0", submitter="carol")
    rc.take(wid)
    queued = rc.submit(device_id="gpubox:gpu0")
    (entry,) = view(rc, queued["id"])["waiting_for"]
    assert entry["until"] == T0_PLUS_600


def test_behind_a_reservation_by_an_earlier_job(rc: Harness) -> None:
    # STORE-062: the any-device job at the head reserves both busy devices; the job
    # pinned to gpu1 behind it waits for the holder and for that job.
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    a = rc.submit(device_id="gpubox:gpu0", submitter="carol")
    b = rc.submit(device_id="gpubox:gpu1", submitter="dave")
    rc.take(wid)
    head = rc.submit(device_id="", selector="")  # EXT-CLI-1: any device
    pinned = rc.submit(device_id="gpubox:gpu1")
    assert head["state"] == pinned["state"] == "queued"
    head_waits = view(rc, head["id"])["waiting_for"]
    assert [e["device_id"] for e in head_waits] == ["gpubox:gpu0", "gpubox:gpu1"]
    assert [e["job_id"] for e in head_waits] == [a["id"], b["id"]]
    assert all("reserved_by" not in e for e in head_waits)  # its own reservations
    (entry,) = view(rc, pinned["id"])["waiting_for"]
    assert entry["holder"] == "dave" and entry["job_id"] == b["id"]
    assert entry["reserved_by"] == head["id"]


def test_reserved_free_device_names_only_the_job_ahead(rc: Harness) -> None:
    # A pinned job whose device is out reserves it; an any-device job behind it then
    # sees that device reserved by the job ahead.
    rc.register("gpubox", ("gpu0",))
    rc.fault("gpubox:gpu0", "verify failed: pid 7 holds the card")
    first = rc.submit(device_id="gpubox:gpu0")
    later = rc.submit(device_id="", selector="")
    (entry,) = view(rc, later["id"])["waiting_for"]
    assert entry == {
        "device_id": "gpubox:gpu0",
        "reserved_by": first["id"],
        "state": "unhealthy",
        "quarantine_reason": "verify failed: pid 7 holds the card",
    }


def test_on_an_unhealthy_device_state_and_reason(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0",))
    rc.fault("gpubox:gpu0", "verify failed: pid 7 holds the card")
    queued = rc.submit(device_id="gpubox:gpu0")
    assert view(rc, queued["id"])["waiting_for"] == [
        {
            "device_id": "gpubox:gpu0",
            "state": "unhealthy",
            "quarantine_reason": "verify failed: pid 7 holds the card",
        }
    ]


def test_state_carries_queued_waiting_for_beside_waiting_seconds(rc: Harness) -> None:
    # EXT-WHY-1a: a map from every queued job to its list; omitted when nothing queues.
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    assert "queued_waiting_for" not in rc.client.get("/v1/state").json()
    hold_id = hold(rc, "gpubox:gpu0")
    rc.take(wid)
    rc.fault("gpubox:gpu1", "fan stuck")
    q0 = rc.submit(device_id="gpubox:gpu0")
    q1 = rc.submit(device_id="gpubox:gpu1")
    state = rc.client.get("/v1/state").json()
    assert state["queued_waiting_seconds"].keys() == state["queued_waiting_for"].keys()
    waits = state["queued_waiting_for"]
    assert waits[q0["id"]][0]["job_id"] == hold_id
    assert waits[q1["id"]] == [
        {"device_id": "gpubox:gpu1", "state": "unhealthy", "quarantine_reason": "fan stuck"}
    ]
    # Each entry is what the job view says for the same job.
    assert waits[q0["id"]] == view(rc, q0["id"])["waiting_for"]


def test_state_answers_for_a_long_queue_in_one_gathering(rc: Harness, monkeypatch: Any) -> None:
    from resource_controller.store import jobs

    rc.register("gpubox", ("gpu0",))
    rc.fault("gpubox:gpu0", "fan stuck")
    for _ in range(20):
        rc.submit(device_id="gpubox:gpu0")
    calls: list[int] = []
    real = jobs.wait_snapshot

    def counted(conn: Any, queued: Any, *rest: Any) -> Any:
        calls.append(1)
        return real(conn, queued, *rest)

    monkeypatch.setattr(jobs, "wait_snapshot", counted)
    state = rc.client.get("/v1/state").json()
    assert len(state["queued_waiting_for"]) == 20 and calls == [1]


def test_no_wait_refusal_names_the_holder(rc: Harness) -> None:
    # EXT-WHY-2 extends CLI-104: the 409 says who holds the device.
    wid = rc.register("gpubox", ("gpu0",))
    hold_id = hold(rc, "gpubox:gpu0")
    rc.take(wid)
    rc.clock.advance(720)
    msg = assert_error(
        rc.submit_raw(device_id="gpubox:gpu0", no_wait=True), 409, "no_device_available"
    )
    assert "gpubox:gpu0" in msg and "bob" in msg and hold_id[:8] in msg
    assert '"profiling"' in msg and "12m0s" in msg and T0_PLUS_600 in msg
