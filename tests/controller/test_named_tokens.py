"""Tokens that carry a name (EXT-WHO-1..4), on a real loopback controller.

The usual ``wtok``/``ctok``/``atok`` stay unnamed beside named tokens, so each test
shows the base and the extension side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from controller_harness import QUIET, TOKENS, Harness, assert_empty_ok, assert_error

from resource_controller.clock import FakeClock
from resource_controller.controller import serve
from support.served import ServedController

NAMED = TOKENS + ",alicetok:client:alice,bobtok:client:bob,boxtok:worker:gpubox,opstok:admin:ops"


@pytest.fixture
def rc(tmp_path: Path, clock: FakeClock) -> Iterator[Harness]:
    svc = serve.open_services(tmp_path / "data", NAMED, QUIET, clock)
    server = ServedController(svc)
    server.start()
    h = Harness(server, clock, tmp_path / "data")
    h.alice = h.new_client("alicetok")  # type: ignore[attr-defined]
    h.bob = h.new_client("bobtok")  # type: ignore[attr-defined]
    h.box = h.new_client("boxtok")  # type: ignore[attr-defined]
    h.ops = h.new_client("opstok")  # type: ignore[attr-defined]
    try:
        h.register("gpubox", ("gpu0",))
        yield h
    finally:
        h.close()


def submit(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"command": ["python", "train.py"], **fields}
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def kill(client: httpx.Client, job_id: str, submitter: str = "") -> httpx.Response:
    return client.post(f"/v1/jobs/{job_id}/kill", json={"submitter": submitter})


# ---- EXT-WHO-2: submit binds the submitter ----------------------------------------------


@pytest.mark.parametrize(
    ("asserted", "recorded"),
    [
        ("alice", "alice"),
        ("alice@host/sess", "alice@host/sess"),
        ("alicex", "alice"),
        ("bob", "alice"),
        (None, "alice"),
    ],
)
def test_named_client_submit_is_recorded_under_its_name(
    rc: Harness, asserted: str | None, recorded: str
) -> None:
    fields = {} if asserted is None else {"submitter": asserted}
    job = submit(rc.alice, **fields)  # type: ignore[attr-defined]
    assert job["submitter"] == recorded
    assert rc.job(job["id"])["submitter"] == recorded


def test_unnamed_tokens_submit_as_the_base(rc: Harness) -> None:
    # EXT-WHO-1: without a name, the body's submitter stands, and none is a 400.
    assert submit(rc.client, submitter="bob")["submitter"] == "bob"
    r = rc.client.post("/v1/jobs", json={"command": ["true"]})
    assert_error(r, 400, "bad_request")


def test_named_admin_submits_as_asserted(rc: Harness) -> None:
    # Admin tokens keep the override (EXT-WHO-2): the assertion stands, the name fills a gap.
    assert submit(rc.ops, submitter="bob")["submitter"] == "bob"  # type: ignore[attr-defined]
    assert submit(rc.ops)["submitter"] == "ops"  # type: ignore[attr-defined]


# ---- EXT-WHO-2: kill and release ---------------------------------------------------------


def test_named_client_cannot_kill_another_users_job_whatever_the_body_says(rc: Harness) -> None:
    rc.submit(device_id="gpubox:gpu0")  # occupies the device
    queued = submit(rc.client, device_id="gpubox:gpu0", submitter="alice@laptop")
    assert queued["state"] == "queued"

    message = assert_error(kill(rc.bob, queued["id"], "alice@laptop"), 403, "not_job_owner")  # type: ignore[attr-defined]
    assert "alice@laptop" in message and "bob" in message
    assert rc.job(queued["id"])["state"] == "queued"

    # Alice's token ends it even when the body names someone else; the reason names her.
    assert_empty_ok(kill(rc.alice, queued["id"], "bob"))  # type: ignore[attr-defined]
    job = rc.job(queued["id"])
    assert job["state"] == "killed" and job["kill_reason"] == "killed by alice"


def test_named_client_kills_jobs_under_its_name(rc: Harness) -> None:
    rc.submit(device_id="gpubox:gpu0")  # occupies the device: the rest stay queued
    for submitter in ("alice", "alice@host/sess", "alice/sess"):
        job = submit(rc.client, submitter=submitter)
        assert_empty_ok(kill(rc.alice, job["id"], submitter))  # type: ignore[attr-defined]
        assert rc.job(job["id"])["kill_reason"] == f"killed by {submitter}"
    job = submit(rc.client, submitter="alicex")
    assert_error(kill(rc.alice, job["id"], "alicex"), 403, "not_job_owner")  # type: ignore[attr-defined]


def test_release_of_a_running_job_is_owned_too(rc: Harness) -> None:
    # Release is the same route (CLI-130): a running job is flagged only for its owner.
    job_id, wid = rc.running_job()  # submitted as "alice" by the unnamed client token
    assert_error(kill(rc.bob, job_id, "alice"), 403, "not_job_owner")  # type: ignore[attr-defined]
    assert rc.poll(wid).status_code == 204  # nothing to deliver: no kill was flagged
    assert_empty_ok(kill(rc.alice, job_id))  # type: ignore[attr-defined]
    polled = rc.poll(wid).json()
    assert polled["kills"] == [job_id], polled


def test_admin_override_stays(rc: Harness) -> None:
    rc.submit(device_id="gpubox:gpu0")  # occupies the device: the rest stay queued
    a = submit(rc.bob)  # type: ignore[attr-defined]
    b = submit(rc.bob)  # type: ignore[attr-defined]
    c = submit(rc.bob)  # type: ignore[attr-defined]
    assert_empty_ok(kill(rc.admin, a["id"], "alice"))
    assert rc.job(a["id"])["kill_reason"] == "killed by admin override (as alice)"
    assert_empty_ok(kill(rc.ops, b["id"]))  # type: ignore[attr-defined]
    assert rc.job(b["id"])["kill_reason"] == "killed by admin override (as ops)"
    assert_empty_ok(kill(rc.ops, c["id"], "carol"))  # type: ignore[attr-defined]
    assert rc.job(c["id"])["kill_reason"] == "killed by admin override (as carol)"


def test_unnamed_client_keeps_the_base_check(rc: Harness) -> None:
    # API-046: the assertion must equal the job's submitter, even for a named token's job.
    job = submit(rc.alice)  # type: ignore[attr-defined]
    assert_error(kill(rc.client, job["id"], "bob"), 403, "not_job_owner")
    assert_empty_ok(kill(rc.client, job["id"], "alice"))


# ---- EXT-WHO-3: a named worker token registers only its host ------------------------------


def test_named_worker_token_registers_only_its_host(rc: Harness) -> None:
    decl = [{"name": "gpu0"}]
    message = assert_error(
        rc.box.post("/v1/workers/register", json={"host": "otherbox", "devices": decl}),  # type: ignore[attr-defined]
        403,
        "forbidden",
    )
    assert "gpubox" in message and "otherbox" in message
    assert [v["device"]["id"] for v in rc.client.get("/v1/devices").json()] == ["gpubox:gpu0"]

    r = rc.box.post("/v1/workers/register", json={"host": "gpubox", "devices": decl})  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    assert r.json()["worker_id"]


def test_unnamed_worker_and_admin_tokens_register_any_host(rc: Harness) -> None:
    rc.register("otherbox")
    r = rc.ops.post("/v1/workers/register", json={"host": "thirdbox", "devices": []})  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text


# ---- EXT-WHO-4: whoami -----------------------------------------------------------------


def test_whoami_adds_the_name(rc: Harness) -> None:
    assert rc.alice.get("/v1/whoami").json() == {"role": "client", "name": "alice"}  # type: ignore[attr-defined]
    assert rc.ops.get("/v1/whoami").json() == {"role": "admin", "name": "ops"}  # type: ignore[attr-defined]
    assert rc.client.get("/v1/whoami").json() == {"role": "client"}
    assert rc.admin.get("/v1/whoami").json() == {"role": "admin"}
    assert_error(rc.box.get("/v1/whoami"), 403, "forbidden")  # type: ignore[attr-defined]


def test_openapi_describes_the_name(rc: Harness) -> None:
    schema = rc.client.get("/openapi.json").json()["components"]["schemas"]["Whoami"]
    assert set(schema["properties"]) == {"role", "name"}
    assert schema["required"] == ["role"]
