"""``GET /v1/jobs`` items carry ``lease_epoch`` as the single-job view does (EXT-EPOCH-2)."""

from __future__ import annotations

from controller_harness import Harness


def test_job_list_items_carry_the_lease_epoch_of_the_job_view(rc: Harness) -> None:
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    first = rc.submit(device_id="gpubox:gpu0")
    second = rc.submit(device_id="gpubox:gpu1")
    queued = rc.submit(device_id="gpubox:gpu0")
    assert queued["state"] == "queued"
    rc.take(wid)
    r = rc.report(first["id"], wid, "succeeded", exit_code=0)
    assert r.status_code == 200, r.text
    rc.take(wid)  # the queued job now holds gpu0 under a newer lease

    listed = {j["id"]: j for j in rc.client.get("/v1/jobs").json()["jobs"]}
    epochs = {}
    for job_id in (first["id"], second["id"], queued["id"]):
        single = rc.job(job_id)
        assert single["lease_epoch"] > 0, single
        assert listed[job_id]["lease_epoch"] == single["lease_epoch"]
        epochs[job_id] = single["lease_epoch"]
    assert len(set(epochs.values())) == 3  # EXT-EPOCH-1: never reused


def test_a_job_that_never_held_a_lease_lists_without_an_epoch(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0",))
    rc.submit(device_id="gpubox:gpu0")
    waiting = rc.submit(device_id="gpubox:gpu0")
    listed = {j["id"]: j for j in rc.client.get("/v1/jobs").json()["jobs"]}
    assert "lease_epoch" not in listed[waiting["id"]]
    assert "lease_epoch" not in rc.job(waiting["id"])
