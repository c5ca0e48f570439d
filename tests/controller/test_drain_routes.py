"""The drain routes and how a draining device shows (EXT-DRAIN-3a)."""

from __future__ import annotations

from typing import Any

from controller_harness import Harness, assert_empty_ok, assert_error
from test_events import Reader

from resource_controller.clock import FakeClock

DEV = "gpubox:gpu0"


def drain(rc: Harness, device: str = DEV, **body: Any) -> Any:
    return rc.admin.post(
        f"/v1/devices/{device}/drain", json={"submitter": "ops", "reason": "driver", **body}
    )


def test_drain_and_undrain_are_admin_routes(rc: Harness) -> None:
    rc.register()
    assert_error(rc.client.post(f"/v1/devices/{DEV}/drain", json={}), 403, "forbidden")
    assert_error(rc.client.post(f"/v1/devices/{DEV}/undrain"), 403, "forbidden")
    assert_error(rc.anon.post(f"/v1/devices/{DEV}/drain", json={}), 401, "unauthorized")


def test_unknown_devices_are_404_not_found(rc: Harness) -> None:
    rc.register()
    assert_error(drain(rc, "gpubox:gpu9"), 404, "not_found")
    assert_error(rc.admin.post("/v1/devices/gpubox:gpu9/undrain"), 404, "not_found")


def test_a_bad_body_is_400(rc: Harness) -> None:
    rc.register()
    r = rc.admin.post(f"/v1/devices/{DEV}/drain", json={"submitter": 5, "reason": ""})
    assert_error(r, 400, "bad_request")


def test_the_device_object_carries_the_flag_only_while_draining(
    rc: Harness, clock: FakeClock
) -> None:
    rc.register()
    assert set(rc.device(DEV)["device"]) & {"draining", "drained_by"} == set()
    assert_empty_ok(drain(rc))
    device = rc.device(DEV)["device"]
    assert device["draining"] is True
    assert device["drained_by"] == "ops"
    assert device["drain_reason"] == "driver"
    assert device["drained_at"] == "2027-01-15T08:00:00Z"
    assert device["state"] == "ready"
    state = rc.client.get("/v1/state").json()
    assert state["devices"][0]["device"] == device
    clock.advance(90)
    assert_empty_ok(drain(rc, reason=""))  # again: replaces who, when and why
    device = rc.device(DEV)["device"]
    assert device["drained_at"] == "2027-01-15T08:01:30Z"
    assert "drain_reason" not in device  # omitted when empty
    described = rc.client.get(f"/v1/devices/{DEV}/describe").json()
    assert described["device"]["draining"] is True
    assert_empty_ok(rc.admin.post(f"/v1/devices/{DEV}/undrain"))
    assert_empty_ok(rc.admin.post(f"/v1/devices/{DEV}/undrain"))  # not draining: nothing
    device = rc.device(DEV)["device"]
    assert set(device) & {"draining", "drained_by", "drained_at", "drain_reason"} == set()


def test_each_drain_and_undrain_publishes_a_devices_event(rc: Harness) -> None:
    reader = Reader(rc.url, {"Authorization": "Bearer ctok"}, {})
    try:
        rc.register()
        reader.until(lambda e: e["kind"] == "devices")
        assert_empty_ok(drain(rc))
        event = reader.until(lambda e: e["kind"] == "devices")
        assert event["payload"][0]["device"]["draining"] is True
        assert_empty_ok(rc.admin.post(f"/v1/devices/{DEV}/undrain"))
        event = reader.until(lambda e: e["kind"] == "devices")
        assert "draining" not in event["payload"][0]["device"]
    finally:
        rc.server.begin_shutdown()
        reader.close()


def test_a_pinned_job_queues_for_a_draining_device_and_starts_on_undrain(rc: Harness) -> None:
    # EXT-DRAIN-2 and EXT-FAST-1: undrain is a change that can place a job, so it does.
    wid = rc.register(labels={"gpu0": {"k": "a"}})
    assert_empty_ok(drain(rc))
    job = rc.submit(device_id=DEV)
    assert job["state"] == "queued"
    view = rc.client.get(f"/v1/jobs/{job['id']}").json()
    assert view["waiting_for"] == [{"device_id": DEV, "draining": True}]
    explain = rc.client.get("/v1/explain", params={"selector": "k=a"}).json()
    assert explain["matching"] == [DEV] and explain["free"] == []
    assert_empty_ok(rc.admin.post(f"/v1/devices/{DEV}/undrain"))
    assert [a["job_id"] for a in rc.take(wid)] == [job["id"]]


def test_a_running_job_keeps_its_draining_device_until_it_ends(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    assert_empty_ok(drain(rc))
    view = rc.device(DEV)
    assert view["job_id"] == job_id and view["device"]["draining"] is True
    nxt = rc.submit(device_id=DEV)
    r = rc.report(job_id, wid, "succeeded", exit_code=0)
    assert r.status_code == 200, r.text
    assert rc.job(nxt["id"])["state"] == "queued"
    assert "job_id" not in rc.device(DEV)
