"""Authentication and common HTTP behaviour (controller-api.md §1, §3)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
from controller_harness import Harness, assert_error, open_controller

from resource_controller.clock import FakeClock

STATE = "/v1/state"
REGISTER = "/v1/workers/register"


def headers(value: str) -> dict[str, str]:
    return {"Authorization": value}


# ---- AUTH-001 / AUTH-003: 401 ------------------------------------------------------------


UNAUTHORIZED = [
    "ctok",  # bare token, no scheme
    "bearer ctok",  # lowercase scheme
    "BEARER ctok",
    "Basic ctok",  # another scheme
    "Bearer",  # no token
    "Bearer  ctok",  # two spaces: the token would be " ctok"
    "Bearer nope",  # unknown
    "Bearer ctok,atok",
    "Bearer wtok:worker",
]


def test_unauthorized(rc: Harness) -> None:
    # AUTH-001: exactly "Bearer <known token>"; anything else (or nothing) is 401.
    assert_error(rc.anon.get(STATE), 401, "unauthorized")
    for authorization in UNAUTHORIZED:
        r = rc.anon.get(STATE, headers=headers(authorization))
        assert_error(r, 401, "unauthorized")


def test_unauthorized_on_every_kind_of_route(rc: Harness) -> None:
    # AUTH-001: worker, client and admin routes alike.
    for method, path in [
        ("POST", REGISTER),
        ("GET", "/v1/workers/w/assignments"),
        ("POST", "/v1/jobs/j/logs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/whoami"),
        ("POST", "/v1/devices/h:d/clear"),
        ("DELETE", "/v1/devices/h:d"),
    ]:
        assert_error(rc.anon.request(method, path), 401, "unauthorized")


def test_query_token_is_ignored_outside_events(rc: Harness) -> None:
    # AUTH-004: only /v1/events reads ?token=; /v1/state and the rest answer 401.
    for path in [STATE, "/v1/devices", "/v1/jobs", "/v1/whoami"]:
        for token in ["ctok", "atok"]:
            assert_error(rc.anon.get(path, params={"token": token}), 401, "unauthorized")


def test_query_token_does_not_rescue_a_post(rc: Harness) -> None:
    # AUTH-004: every POST route ignores ?token=.
    r = rc.anon.post(
        "/v1/jobs",
        params={"token": "ctok"},
        json={"device_id": "h:d", "command": ["x"], "submitter": "a"},
    )
    assert_error(r, 401, "unauthorized")


def test_liveness_check_is_a_401(rc: Harness) -> None:
    # AUTH-031: deployments probe with an unauthenticated GET /v1/state.
    r = rc.anon.get(STATE)
    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"


# ---- AUTH-002 / AUTH-003: 403 -----------------------------------------------------------


def test_worker_token_on_client_route_is_forbidden(rc: Harness) -> None:
    msg = assert_error(rc.worker.get(STATE), 403, "forbidden")
    # The message names the token's role and the route's role.
    assert "worker" in msg and "client" in msg


def test_client_token_on_worker_routes_is_forbidden(rc: Harness) -> None:
    wid = rc.register()
    for method, path in [
        ("POST", REGISTER),
        ("POST", f"/v1/workers/{wid}/labels"),
        ("GET", f"/v1/workers/{wid}/assignments"),
        ("POST", f"/v1/workers/{wid}/heartbeat"),
        ("POST", "/v1/jobs/j/logs"),
        ("POST", "/v1/jobs/j/status"),
        ("POST", "/v1/devices/gpubox:gpu0/fault"),
    ]:
        msg = assert_error(rc.client.request(method, path, json={}), 403, "forbidden")
        assert "client" in msg and "worker" in msg


def test_admin_routes_take_only_admin(rc: Harness) -> None:
    for c in (rc.worker, rc.client):
        assert_error(c.post("/v1/devices/h:d/clear"), 403, "forbidden")
        assert_error(c.delete("/v1/devices/h:d"), 403, "forbidden")


def test_admin_token_passes_worker_and_client_routes(rc: Harness) -> None:
    # AUTH-002: admin implies every role.
    r = rc.admin.post(REGISTER, json={"host": "gpubox", "devices": [{"name": "gpu0"}]})
    assert r.status_code == 200, r.text
    assert rc.admin.get(STATE).status_code == 200
    assert rc.admin.post(f"/v1/workers/{r.json()['worker_id']}/heartbeat").status_code == 200
    assert rc.admin.get("/v1/devices").status_code == 200


def test_client_token_passes_client_routes(rc: Harness) -> None:
    for path in [STATE, "/v1/devices", "/v1/jobs", "/v1/whoami"]:
        assert rc.client.get(path).status_code == 200, path


def test_worker_token_passes_worker_routes(rc: Harness) -> None:
    wid = rc.register()
    assert rc.worker.post(f"/v1/workers/{wid}/heartbeat").status_code == 200


# ---- AUTH-003: authentication before anything about the request -------------------------


def test_unauthenticated_bad_json_is_401_not_400(rc: Harness) -> None:
    r = rc.anon.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_error(r, 401, "unauthorized")
    r = rc.anon.post(REGISTER, content=b"[[[")
    assert_error(r, 401, "unauthorized")


def test_wrong_role_bad_json_is_403_not_400(rc: Harness) -> None:
    assert_error(rc.worker.post("/v1/jobs", content=b"{not json"), 403, "forbidden")
    assert_error(rc.client.post(REGISTER, content=b"{not json"), 403, "forbidden")


def test_auth_before_query_and_path(rc: Harness) -> None:
    # A bad ?limit= and an unknown job ID are still 401 without a token.
    assert_error(rc.anon.get("/v1/jobs", params={"limit": "abc"}), 401, "unauthorized")
    assert_error(rc.anon.get("/v1/jobs/no-such-job"), 401, "unauthorized")
    assert_error(rc.anon.get("/v1/jobs/x/logs", params={"follow": "bad"}), 401, "unauthorized")
    assert_error(rc.worker.get("/v1/jobs", params={"limit": "abc"}), 403, "forbidden")


def test_oversized_bodies_are_still_401_without_a_token(rc: Harness) -> None:
    big = b"x" * (1024 * 1024 + 1)
    assert_error(rc.anon.post("/v1/jobs/j/logs", content=big), 401, "unauthorized")
    assert_error(rc.anon.post("/v1/workers/w/heartbeat", content=big), 401, "unauthorized")


# ---- AUTH-020 / AUTH-021: instance identity ---------------------------------------------


def instance(r: httpx.Response) -> str:
    value: str | None = r.headers.get("Rc-Controller-Instance")
    assert value, (r.status_code, dict(r.headers))
    return value


def test_instance_header_on_every_kind_of_response(rc: Harness) -> None:
    answers = [
        rc.client.get(STATE),  # 200
        rc.anon.get(STATE),  # 401
        rc.worker.get(STATE),  # 403
        rc.client.get("/v1/no-such-route"),  # 404 (unmatched)
        rc.client.get("/v1/jobs/no-such-job"),  # 404 not_found
        rc.client.put(STATE),  # 405
        rc.client.post("/v1/jobs", content=b"{"),  # 400
        rc.worker.post("/v1/workers/w/heartbeat"),  # 200, empty body
        rc.worker.get("/v1/workers/w/assignments", params={"wait": "10ms"}),  # 204
    ]
    values = {instance(r) for r in answers}
    assert len(values) == 1
    assert uuid.UUID(values.pop())  # a UUID (AUTH-021)


def test_instance_header_on_a_stream(rc: Harness) -> None:
    wid = rc.register()
    job = rc.submit(device_id="gpubox:gpu0")
    rc.take(wid)
    rc.report(job["id"], wid, "succeeded", exit_code=0)
    r = rc.client.get(f"/v1/jobs/{job['id']}/logs")  # follow of a finished job: ends at once
    assert r.status_code == 200
    assert instance(r) == instance(rc.client.get(STATE))


def test_instance_differs_between_controllers_on_the_same_data(rc: Harness, tmp_path: Path) -> None:
    # AUTH-021: a fresh identity per process start, even with the same database.
    first = instance(rc.client.get(STATE))
    other = open_controller(tmp_path / "data", FakeClock())
    try:
        with httpx.Client(base_url=other.url, headers={"Authorization": "Bearer ctok"}) as c:
            second = instance(c.get(STATE))
            assert instance(c.get(STATE)) == second  # constant within one process
    finally:
        other.stop()
    assert first != second


# ---- AUTH-030: unmatched requests ---------------------------------------------------------


def test_unknown_path_is_404_without_auth(rc: Harness) -> None:
    # API-010: no lease route; a trailing slash is another path, so it is a 404 too, never
    # a redirect. (/healthz exists: EXT-METRICS-3 adds it, test_events.py covers it.)
    for path in [
        "/v1/nope",
        "/anything-else",
        "/v1/jobs/a/b/c",
        "/v2/state",
        "/v1",
        "/v1/leases",
        "/healthz/",
        "/v1/state/",
        "/v1/jobs/",
    ]:
        for c in (rc.anon, rc.admin):
            r = c.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert instance(r)


def test_wrong_method_on_a_known_path_is_405(rc: Harness) -> None:
    assert rc.client.put(STATE).status_code == 405
    assert rc.client.delete("/v1/jobs").status_code == 405
    # API-010: there is no single-device GET besides describe.
    assert rc.client.get("/v1/devices/gpubox:gpu0").status_code == 405


def test_no_framework_docs(rc: Harness) -> None:
    # API-010: the framework's interactive documentation is not served.
    for path in ["/docs", "/redoc"]:
        assert rc.admin.get(path).status_code == 404


def test_openapi_document_is_a_client_route(rc: Harness) -> None:
    # API-010: GET /openapi.json needs a client (or admin) token.
    assert_error(rc.anon.get("/openapi.json"), 401, "unauthorized")
    assert_error(rc.worker.get("/openapi.json"), 403, "forbidden")
    r = rc.client.get("/openapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert "/v1/jobs" in r.json()["paths"]


# ---- API-001 / API-003: no framework-shaped errors ----------------------------------------


SUBMIT_WRONG_TYPES: list[dict[str, object]] = [
    {"priority": "5"},  # string for an int
    {"priority": True},  # bool is never an int
    {"priority": 1.0},  # float for an int
    {"priority": 1.5},
    {"max_runtime_seconds": False},
    {"idle_timeout_seconds": "60"},
    {"command": "python train.py"},  # string for a list
    {"command": [1, 2]},
    {"env": {"A": 1}},
    {"env": ["A=1"]},
    {"no_wait": "yes"},
    {"no_wait": 1},
    {"submitter": 7},
    {"device_id": ["gpubox:gpu0"]},
    {"kind": 1},
    {"stdio": False},
]

WORKER_WRONG_TYPES: list[tuple[str, dict[str, object]]] = [
    (REGISTER, {"host": 5}),
    (REGISTER, {"host": "h", "devices": {"name": "gpu0"}}),
    (REGISTER, {"host": "h", "devices": [{"name": "gpu0", "max_runtime_seconds": True}]}),
    (REGISTER, {"host": "h", "devices": [{"name": "gpu0", "max_runtime_seconds": 1.5}]}),
    (REGISTER, {"host": "h", "recovery": {"isolated": "yes"}}),
    (REGISTER, {"host": "h", "labels": {"": {"cpus": 64}}}),
    (REGISTER, {"host": "h", "sheet": ["# no"]}),
    ("/v1/workers/w/labels", {"host": "h", "devices": "gpu0"}),
    ("/v1/workers/w/heartbeat", {"running_job_ids": "abc"}),
    ("/v1/workers/w/heartbeat", {"running_job_ids": [1]}),
    ("/v1/jobs/j/status", {"worker_id": "w", "state": "failed", "exit_code": True}),
    ("/v1/jobs/j/status", {"worker_id": "w", "state": "failed", "exit_code": "1"}),
    ("/v1/jobs/j/status", {"worker_id": 1, "state": "failed"}),
    ("/v1/jobs/j/status", {"worker_id": "w", "state": "failed", "lease_epoch": "3"}),
    ("/v1/devices/h:d/fault", {"reason": 1}),
]


def test_wrong_types_are_400_bad_request(rc: Harness) -> None:
    # API-001 / API-003: a wrong JSON type is our 400 with exactly two keys, never a 422.
    rc.register()
    for fields in SUBMIT_WRONG_TYPES:
        body = {"device_id": "gpubox:gpu0", "command": ["x"], "submitter": "a", **fields}
        r = rc.client.post("/v1/jobs", json=body)
        assert_error(r, 400, "bad_request")
    for path, body in WORKER_WRONG_TYPES:
        assert_error(rc.worker.post(path, json=body), 400, "bad_request")
    for raw in [b"[]", b'"x"', b"1", b"{", b'{"a":1}{}', b"\xff\xfe"]:
        r = rc.client.post("/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
        assert_error(r, 400, "bad_request")


def test_kill_wrong_type_is_400(rc: Harness) -> None:
    assert_error(rc.client.post("/v1/jobs/j/kill", json={"submitter": 1}), 400, "bad_request")


def test_unknown_fields_in_worker_bodies_are_ignored(rc: Harness) -> None:
    # API-001 for the bodies a worker sends: fields a route does not know are ignored,
    # so that a newer worker keeps its devices in the pool.
    wid = rc.register(host="gpubox", devices=("gpu0",), future_field={"x": 1}, nothing=None)
    job = rc.submit(device_id="gpubox:gpu0")
    assert job["state"] == "assigned"
    rc.take(wid)
    r = rc.worker.post(f"/v1/workers/{wid}/heartbeat", json={"running_job_ids": [], "x": 1})
    assert r.status_code == 200, r.text
    r = rc.report(job["id"], wid, "succeeded", exit_code=0, extra=True)
    assert r.status_code == 200


def test_an_unknown_field_in_a_submit_is_refused_by_name(rc: Harness) -> None:
    # docs/agents.md "Unknown fields": a client body's unknown field is 400 bad_request
    # naming it. Ignored, "device" (for device_id) put the job on any device.
    rc.register(host="gpubox", devices=("gpu0", "gpu1"))
    r = rc.submit_raw(device="gpubox:gpu1")
    assert_error(r, 400, "bad_request")
    message = r.json()["message"]
    assert "'device'" in message and "did you mean device_id?" in message
    assert rc.client.get("/v1/jobs").json()["jobs"] == []  # nothing was queued
    for fields in ({"colour": "blue"}, {"nested": {"a": [1]}}, {"later_feature": None}):
        r = rc.submit_raw(device_id="gpubox:gpu0", **fields)
        assert_error(r, 400, "bad_request")
        assert repr(next(iter(fields))) in r.json()["message"]


def test_unknown_fields_in_kill_and_drain_are_refused_by_name(rc: Harness) -> None:
    rc.register(host="gpubox", devices=("gpu0",))
    job = rc.submit(device_id="gpubox:gpu0")
    r = rc.client.post(f"/v1/jobs/{job['id']}/kill", json={"submiter": "alice"})
    assert_error(r, 400, "bad_request")
    assert "'submiter' (did you mean submitter?)" in r.json()["message"]
    assert rc.job(job["id"])["state"] == "assigned"  # not killed
    r = rc.admin.post("/v1/devices/gpubox:gpu0/drain", json={"submitter": "ops", "reasn": "x"})
    assert_error(r, 400, "bad_request")
    assert "'reasn'" in r.json()["message"]


def test_every_field_the_clients_send_is_known() -> None:
    # The reference client's submit keys (CLI-072) and what our own client adds
    # (count, device_ids: EXT-GANG-6) are all fields of the submit body.
    from resource_controller import wire
    from resource_controller.client.submit import Submit

    cli_072 = {
        "device_id", "selector", "command", "cwd", "env", "submitter", "idempotency_key",
        "priority", "max_runtime_seconds", "idle_timeout_seconds", "no_wait", "kind",
        "reason", "stdio",
    }  # fmt: skip
    one = Submit(
        ["x"],
        device="h:g,h:h",
        cwd="/w",
        env={"A": "1"},
        priority=1,
        max_runtime=1,
        idle_timeout=1,
        no_wait=True,
        kind="job",
        reason="r",
        stdio="pipe",
    ).body("alice")
    other = Submit(["x"], select="a=b", count=2, after=["j1"], after_any=True)
    body = {**one, **other.body("alice", after=["j1"])}
    assert set(body) <= set(wire.SubmitRequest.model_fields)
    assert cli_072 <= set(wire.SubmitRequest.model_fields)


def test_null_optional_fields_mean_absent(rc: Harness) -> None:
    # API-001: null for an optional field means the same as absent.
    rc.register()
    r = rc.client.post(
        "/v1/jobs",
        json={
            "device_id": "gpubox:gpu0",
            "selector": None,
            "command": ["x"],
            "submitter": "alice",
            "cwd": None,
            "env": None,
            "idempotency_key": None,
            "priority": None,
            "max_runtime_seconds": None,
            "idle_timeout_seconds": None,
            "no_wait": None,
            "kind": None,
            "reason": None,
            "stdio": None,
        },
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["priority"] == 0 and job["kind"] == "job" and "stdio" not in job
    r = rc.worker.post(
        "/v1/workers/register",
        json={"host": "other", "boot_id": None, "devices": None, "recovery": None},
    )
    assert r.status_code == 200, r.text


def test_validation_errors_never_look_like_the_framework(rc: Harness) -> None:
    # API-003: no 422, no {"detail": ...}, on any route we can feed garbage.
    rc.register()
    for method, path, client in [
        ("POST", "/v1/jobs", rc.client),
        ("POST", REGISTER, rc.worker),
        ("POST", "/v1/workers/w/labels", rc.worker),
        ("POST", "/v1/workers/w/heartbeat", rc.worker),
        ("POST", "/v1/jobs/j/status", rc.worker),
        ("POST", "/v1/jobs/j/kill", rc.client),
        ("POST", "/v1/devices/gpubox:gpu0/fault", rc.worker),
    ]:
        for raw in [
            b"{",
            b"[1]",
            b'{"host": [], "state": {}, "submitter": [], "running_job_ids": {}}',
        ]:
            r = client.request(method, path, content=raw)
            assert r.status_code != 422, (path, raw, r.text)
            assert "detail" not in r.text, (path, raw, r.text)
            assert_error(r, 400, "bad_request")
