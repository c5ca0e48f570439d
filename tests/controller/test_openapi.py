"""The published OpenAPI document and the 405 answer (EXT-LIMITS-5, AUTH-030, API-010)."""

from __future__ import annotations

from typing import Any

from controller_harness import ROUTES, Harness, role_of


def _doc(rc: Harness) -> dict[str, Any]:
    r = rc.client.get("/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


def _ops(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_every_route_has_security_a_role_and_its_errors(rc: Harness) -> None:
    # EXT-LIMITS-5: the bearer scheme, the role in words, ErrorBody for every error.
    doc = _doc(rc)
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert {(m, p) for m, p, _ in _ops(doc)} == set(ROUTES)
    for method, path, op in _ops(doc):
        where = f"{method.upper()} {path}"
        role = role_of(ROUTES[(method, path)])
        if role == "none":  # /healthz (EXT-METRICS-3)
            assert op["security"] == [] and "401" not in op["responses"], where
            continue
        assert op["security"] == [{"bearer": []}], where
        assert "Role: " + role in op["description"], where
        responses = op["responses"]
        assert "422" not in responses, where  # never sent: bodies are parsed by hand
        for status in ("401", "403"):
            assert status in responses, where
        for status, answer in responses.items():
            if status[0] in "45":
                ref = answer["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", where


def test_request_bodies_and_query_parameters_are_described(rc: Harness) -> None:
    # EXT-LIMITS-5: a fuzzer reading the document reaches every field.
    doc = _doc(rc)
    paths = doc["paths"]
    schemas = doc["components"]["schemas"]

    def body_ref(method: str, path: str) -> str:
        ref = paths[path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        return str(ref).rsplit("/", 1)[1]

    assert body_ref("post", "/v1/jobs") == "SubmitRequest"
    assert set(schemas["SubmitRequest"]["properties"]) >= {
        "command",
        "selector",
        "max_runtime_seconds",
        "idle_timeout_seconds",
        "env",
        "priority",
        "no_wait",
    }
    assert body_ref("post", "/v1/workers/register") == "RegisterRequest"
    assert body_ref("post", "/v1/jobs/{job_id}/kill") == "KillRequest"
    assert paths["/v1/jobs/{job_id}/kill"]["post"]["requestBody"]["required"] is True
    assert body_ref("post", "/v1/jobs/{job_id}/status") == "StatusReport"
    assert "DeviceDecl" in schemas and "RecoveryProof" in schemas
    raw = paths["/v1/jobs/{job_id}/logs"]["post"]["requestBody"]["content"]
    assert "application/octet-stream" in raw

    def query(method: str, path: str) -> set[str]:
        params = paths[path][method].get("parameters", [])
        return {p["name"] for p in params if p["in"] == "query"}

    assert query("get", "/v1/jobs/{job_id}/logs") == {"follow", "offset"}
    assert query("get", "/v1/jobs") >= {"limit", "state", "device", "submitter"}
    assert query("get", "/v1/workers/{worker_id}/assignments") == {"wait", "have"}
    assert query("get", "/v1/explain") == {"selector", "submitter"}  # EXT-SHARE-1
    assert query("post", "/v1/jobs/{job_id}/logs") == {"lease_epoch"}
    offset = next(
        p for p in paths["/v1/jobs/{job_id}/logs"]["get"]["parameters"] if p["name"] == "offset"
    )
    assert offset["schema"] == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
    logs = paths["/v1/jobs/{job_id}/logs"]["get"]["responses"]["200"]["content"]
    assert list(logs) == ["text/plain"]


def test_error_statuses_match_the_routes(rc: Harness) -> None:
    # The statuses each route can answer (API-090), beyond 401/403.
    paths = _doc(rc)["paths"]

    def errors(method: str, path: str) -> set[str]:
        return {s for s in paths[path][method]["responses"] if s[0] in "45"}

    assert errors("post", "/v1/jobs") == {"400", "401", "403", "409", "413"}
    assert errors("post", "/v1/jobs/{job_id}/kill") == {"400", "401", "403", "404", "409", "413"}
    assert errors("get", "/v1/jobs/{job_id}/logs") == {"400", "401", "403", "404"}
    assert errors("delete", "/v1/devices/{device_id}") == {"401", "403", "404", "409"}
    assert errors("get", "/v1/whoami") == {"401", "403"}


def test_405_allow_lists_every_method_of_the_path(rc: Harness) -> None:
    # AUTH-030: /v1/jobs takes GET and POST; the answer used to name POST alone.
    r = rc.client.delete("/v1/jobs")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, POST"
    r = rc.client.put("/v1/devices/gpubox:gpu0")
    assert r.status_code == 405
    assert r.headers["allow"] == "DELETE"
    r = rc.anon.patch("/v1/state")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET"
    assert "rc-controller-instance" in r.headers  # AUTH-020
    r = rc.client.get("/v1/jobs/j1/logs", params={"follow": "false"})
    assert r.status_code == 404  # an ordinary route answer is untouched
