"""EXT-LIMITS over HTTP: body sizes, out-of-range numbers, names, and a failing pass."""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
from controller_harness import CLIENT, WORKER, Harness, assert_error

from resource_controller.controller.routes.workers import parse_wait
from resource_controller.core import states

MIB = 1024 * 1024
REGISTER = "/v1/workers/register"


def _raw_request(
    rc: Harness, head: str, chunks: tuple[bytes, ...] | list[bytes] = ()
) -> tuple[int, dict[str, Any]]:
    """Send ``head`` and ``chunks`` on a fresh socket; return the status and JSON body.

    A raw socket, because the point is what the controller does before the client has
    finished sending: it must answer without reading the rest.
    """
    url = urlsplit(rc.url)
    with socket.create_connection((url.hostname, url.port), timeout=15) as s:
        s.sendall(head.encode())
        try:
            for chunk in chunks:
                s.sendall(chunk)
        except OSError:
            pass  # the controller answered and closed before taking it all: the point
        data = b""
        while b"\r\n\r\n" not in data or not _complete(data):
            got = s.recv(65536)
            if not got:
                break
            data += got
    status_line, _, rest = data.partition(b"\r\n")
    body = rest.split(b"\r\n\r\n", 1)[1]
    return int(status_line.split()[1]), json.loads(body)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def _head(path: str, token: str, extra: str) -> str:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    )


def test_declared_length_over_1mib_is_413_unread(rc: Harness) -> None:
    """EXT-LIMITS-2: a Content-Length over 1 MiB is refused before any byte is read."""
    status, err = _raw_request(rc, _head("/v1/jobs", CLIENT, "Content-Length: 1000000000\r\n"))
    assert status == 413 and err["error"] == "body_too_large", err
    assert "1048576" in err["message"]


def test_chunked_body_over_1mib_is_413(rc: Harness) -> None:
    """The cap also holds while reading a chunked body (no Content-Length to trust)."""
    piece = b" " * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 17  # 1 MiB + 64 KiB, never terminated
    head = _head("/v1/jobs", CLIENT, "Transfer-Encoding: chunked\r\n")
    status, err = _raw_request(rc, head, chunks)
    assert status == 413 and err["error"] == "body_too_large", err


def test_body_of_exactly_1mib_is_read(rc: Harness) -> None:
    rc.register()
    body = json.dumps({"command": ["true"], "submitter": "a", "device_id": "gpubox:gpu0"})
    padded = body.encode().ljust(MIB, b" ")
    r = rc.client.post("/v1/jobs", content=padded, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    status, err = _raw_request(
        rc, _head("/v1/jobs", CLIENT, f"Content-Length: {MIB + 1}\r\n"), [padded + b" "]
    )
    assert status == 413 and err["error"] == "body_too_large"


def test_heartbeat_and_log_append_keep_their_own_caps(rc: Harness) -> None:
    """API-035: heartbeat 64 KiB; API-036: a log chunk up to 1 MiB is raw bytes, not JSON."""
    wid = rc.register()
    hb = f"/v1/workers/{wid}/heartbeat"
    ok = json.dumps({"running_job_ids": []}).encode().ljust(65536, b" ")
    assert rc.worker.post(hb, content=ok).status_code == 200
    status, err = _raw_request(rc, _head(hb, WORKER, "Content-Length: 65537\r\n"), [ok + b" "])
    assert status == 413 and err["error"] == "body_too_large"
    job_id, _ = rc.running_job()
    assert rc.append(job_id, b"\xff\x00not json" * (MIB // 10)).status_code == 200
    assert rc.append(job_id, b"x" * MIB).status_code == 200
    path = f"/v1/jobs/{job_id}/logs"
    status, err = _raw_request(rc, _head(path, WORKER, f"Content-Length: {MIB + 1}\r\n"))
    assert status == 413 and err["error"] == "chunk_too_large"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_runtime_seconds": 10**30}, "max_runtime_seconds"),
        ({"max_runtime_seconds": 9_223_372_036_854_775_000}, "max_runtime_seconds"),
        ({"max_runtime_seconds": -1}, "max_runtime_seconds"),
        ({"idle_timeout_seconds": 10**30}, "idle_timeout_seconds"),
        ({"idle_timeout_seconds": -1}, "idle_timeout_seconds"),
        ({"max_runtime_seconds": 2**31}, "max_runtime_seconds"),
    ],
)
def test_out_of_range_numbers_on_submit_are_400(
    rc: Harness, fields: dict[str, Any], field: str
) -> None:
    """EXT-LIMITS-1: 400 bad_request naming the field and the range, never a 500."""
    rc.register()
    message = assert_error(rc.submit_raw(device_id="gpubox:gpu0", **fields), 400, "bad_request")
    assert field in message and "2147483647" in message
    assert rc.client.get("/v1/jobs").json()["jobs"] == []  # nothing was queued


def test_negative_runtime_cannot_escape_a_ceiling(rc: Harness) -> None:
    """A -1 runtime was stored and ran without a watchdog on a ceilinged device."""
    rc.register("gpubox", ({"name": "gpu0", "max_runtime_seconds": 100},))
    for where in ({"device_id": "gpubox:gpu0"}, {"selector": ""}):
        assert_error(rc.submit_raw(max_runtime_seconds=-1, **where), 400, "bad_request")
    assert rc.submit(device_id="gpubox:gpu0")["max_runtime_seconds"] == 100  # inherited


def test_register_out_of_range_ceiling_and_bad_names(rc: Harness) -> None:
    cases = [
        ({"host": "h", "devices": [{"name": "g", "max_runtime_seconds": 10**30}]}, "devices.0.max"),
        ({"host": "h", "devices": [{"name": "g", "max_runtime_seconds": -1}]}, "devices.0.max"),
        ({"host": "a/b", "devices": []}, "'a/b'"),
        ({"host": "h", "devices": [{"name": "gpu 0"}]}, "'gpu 0'"),
        ({"host": "h", "devices": [{"name": "g?x"}]}, "'g?x'"),
        ({"host": "h", "devices": [{"name": "g%2F"}]}, "'g%2F'"),
        ({"host": "h" * 129, "devices": []}, "128"),
        ({"host": "h", "devices": [{"name": "d" * 129}]}, "128"),
    ]
    for body, word in cases:
        assert word in assert_error(rc.worker.post(REGISTER, json=body), 400, "bad_request"), body
    assert rc.client.get("/v1/devices").json() == []
    rc.register("h" * 128, ("A-z_0.9-" + "d" * 120,))  # at the limit: accepted


def test_status_exit_code_out_of_range_is_400(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    r = rc.report(job_id, wid, "failed", exit_code=10**30)
    assert "exit_code" in assert_error(r, 400, "bad_request")
    assert rc.report(job_id, wid, "failed", exit_code=-(2**31)).status_code == 200


def test_huge_integer_query_parameters_are_not_500(rc: Harness) -> None:
    """int() refuses text of thousands of digits; those must still be ordinary answers."""
    digits = "9" * 5000
    assert_error(rc.client.get("/v1/jobs", params={"limit": digits}), 400, "bad_request")
    assert rc.client.get("/v1/jobs", params={"limit": "0" * 30 + "5"}).status_code == 200
    job_id, _ = rc.running_job()
    for epoch in (digits, "²"):
        assert_error(rc.append(job_id, b"x", lease_epoch=epoch), 409, "stale_lease")
    assert_error(rc.client.get("/v1/explain", params={"selector": "a" * 4097}), 400, "bad_request")


def test_unexpected_failure_in_the_submit_pass_cancels_the_job(
    rc: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """API-042 step 2: any failure of the pass (not only a database error) cancels."""
    rc.register()
    real = rc.svc.store.queue.run_pass

    def broken() -> Any:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    monkeypatch.setattr(rc.svc.store.queue, "run_pass", broken)
    assert_error(rc.submit_raw(device_id="gpubox:gpu0"), 500, "store_error")
    [job] = rc.client.get("/v1/jobs").json()["jobs"]
    assert job["state"] == "killed" and job["kill_reason"] == states.REASON_SUBMIT_SCHEDULE
    monkeypatch.setattr(rc.svc.store.queue, "run_pass", real)
    assert rc.submit(device_id="gpubox:gpu0")["state"] == "assigned"


def test_other_integer_fields_never_500(rc: Harness) -> None:
    """priority keeps its own code; a lease_epoch is compared, never stored (EXT-LIMITS-5)."""
    rc.register()
    r = rc.submit_raw(device_id="gpubox:gpu0", priority=10**30)
    assert_error(r, 400, "priority_out_of_range")
    job_id, wid = rc.running_job()
    r = rc.report(job_id, wid, "succeeded", exit_code=0, lease_epoch=10**30)
    assert_error(r, 409, "stale_lease")
    assert parse_wait("9" * 5000 + "h") == parse_wait(None) == 30.0  # API-034: the default
