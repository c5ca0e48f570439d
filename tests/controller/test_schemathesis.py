"""Schemathesis over the published document, against a real loopback controller (EXT-LIMITS-5).

For each role's token, an unknown token, and none, every operation gets a bounded
number of generated requests, schema-conforming and schema-violating, from a fixed
seed. The run fails on any 5xx (except the one the spec names: ``log_error`` for a log
append whose job ID cannot name a file, LOG-001), on any answer the document does not
describe (its status, content type, headers or body), and on any auth bypass: a
protected route answered without ``401`` to a caller with no valid token, or without
``403`` to a token whose role does not satisfy it (AUTH-002, AUTH-003), whatever else
the generated request got wrong.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
import schemathesis
from controller_harness import ADMIN, CLIENT, ROUTES, WORKER, Harness, role_of
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Err

#: Examples per operation, per generation mode, per role: about a minute in all.
EXAMPLES = int(os.environ.get("RC_FUZZ_EXAMPLES", "12"))
SEED = int(os.environ.get("RC_FUZZ_SEED", "20270115"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
#: Routes that never end by design: an accepted request streams until the reader leaves
#: (EVT-001), so a fuzzed call could only time out. tests/controller/test_events.py
#: covers their authentication, headers and frames; the relay halves (TTY-001) wait for
#: their peer, and tests/controller/test_relay_routes.py covers them.
STREAMS = {"/v1/events", "/v1/jobs/{job_id}/tty/out", "/v1/jobs/{job_id}/tty/in"}
ROLES = {"worker": WORKER, "client": CLIENT, "admin": ADMIN, "bad": "nope-unknown", "none": None}
#: The roles each caller satisfies (AUTH-002: admin implies every role).
SATISFIES = {
    "worker": {"worker"},
    "client": {"client"},
    "admin": {"worker", "client", "admin"},
    "bad": set(),
    "none": set(),
}


@dataclass
class Finding:
    role: str
    method: str
    path: str
    status: int
    title: str
    request: str

    def __str__(self) -> str:
        return f"[{self.role}] {self.method} {self.path} -> {self.status}: {self.title}\n  {self.request}"


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    bypasses: list[Finding] = field(default_factory=list)


def _auth_answer(role: str, method: str, path: str) -> int | None:
    """The status a caller must get on a route it may not use; ``None`` when it may."""
    needed = role_of(ROUTES[(method.lower(), path)])
    if needed == "none":
        return None
    if not SATISFIES[role]:
        return 401
    return None if needed in SATISFIES[role] else 403


def _documented_failure(case: Any, response: Any) -> bool:
    """The spec's one 500: a log append whose job ID is not a safe file name (LOG-001)."""
    if (case.method, case.path) != ("POST", "/v1/jobs/{job_id}/logs"):
        return False
    try:
        return bool(response.status_code == 500 and response.json()["error"] == "log_error")
    except ValueError:
        return False


def _run(url: str, doc: dict[str, Any], role: str, tally: Tally) -> None:
    schema = schemathesis.openapi.from_dict(doc)
    token = ROLES[role]
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operation = result.ok()
        if operation.path in STREAMS:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.seed(SEED)
            @hypothesis.settings(
                max_examples=EXAMPLES,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @hypothesis.given(operation.as_strategy(generation_mode=mode))
            def fuzz(case: Any) -> None:
                headers = {
                    k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"
                }
                if token is not None:
                    headers["Authorization"] = f"Bearer {token}"
                case.headers = headers
                if case.path.endswith("/assignments"):
                    # A long poll waits 30 s unless told less; fuzz everything else.
                    case.query = {**(case.query or {}), "wait": "10ms"}
                response = case.call(base_url=url, timeout=10)
                tally.requests[role] += 1
                refusal = _auth_answer(role, case.method, case.path)
                if refusal is not None and response.status_code != refusal:
                    tally.bypasses.append(
                        Finding(
                            role,
                            case.method,
                            case.path,
                            response.status_code,
                            f"auth bypass: expected {refusal}",
                            case.as_curl_command()[:600],
                        )
                    )
                if _documented_failure(case, response):
                    return
                if response.status_code >= 500:
                    tally.server_errors[role] += 1
                try:
                    case.validate_response(response, checks=CHECKS)
                except (Failure, FailureGroup) as exc:
                    failures = exc.exceptions if isinstance(exc, FailureGroup) else [exc]
                    curl = case.as_curl_command()
                    for f in failures:
                        tally.findings.append(
                            Finding(
                                role,
                                case.method,
                                case.path,
                                response.status_code,
                                f.title,
                                curl[:600],
                            )
                        )

            try:
                fuzz()
            except hypothesis.errors.Unsatisfiable:
                # A route with no input and no security (GET /healthz, EXT-METRICS-3)
                # has nothing a schema-violating request could violate.
                if mode is not GenerationMode.NEGATIVE:
                    raise


@pytest.mark.fuzz
@pytest.mark.timeout(600)
def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1"), labels={"gpu0": {"vram": "80G"}})
    rc.submit(device_id="gpubox:gpu0")
    doc = rc.client.get("/openapi.json").json()
    tally = Tally()
    for role in ROLES:
        _run(rc.url, doc, role, tally)
    report = {
        "requests": dict(tally.requests),
        "server_errors": dict(tally.server_errors),
        "failures": dict(Counter(f.role for f in tally.findings)),
        "bypasses": len(tally.bypasses),
    }
    print(json.dumps(report))
    for f in tally.findings:
        print(f)
    assert not tally.bypasses, f"{report}\n" + "\n".join(str(f) for f in tally.bypasses[:20])
    assert not tally.findings, f"{report}\n" + "\n".join(str(f) for f in tally.findings[:20])
    assert not tally.server_errors, report
