"""``Client.hold``: the submit body of a hold (CLI-121, EXT-CLI-1, EXT-CLI-4)."""

from __future__ import annotations

import pytest

from client.test_api import make


def test_hold_body_is_exactly_a_hold() -> None:
    client, http, _ = make(lambda m, p, kw: {"id": "h1", "state": "queued"})
    job = client.hold(ttl_seconds=1800, reason="manual profiling", device="box:gpu0")
    assert job == {"id": "h1", "state": "queued"}
    method, path, kw = http.calls[0]
    assert (method, path) == ("POST", "/v1/jobs")
    body = kw["body"]
    assert set(body) == {
        "kind",
        "device_id",
        "submitter",
        "reason",
        "max_runtime_seconds",
        "idempotency_key",
    }
    assert (body["kind"], body["device_id"], body["reason"]) == (
        "hold",
        "box:gpu0",
        "manual profiling",
    )
    assert (body["max_runtime_seconds"], body["submitter"]) == (1800, "alice@box")


def test_hold_keys_are_fresh_and_any_device_sends_neither() -> None:
    client, http, _ = make(lambda m, p, kw: {"id": "h1"})
    client.hold(ttl_seconds=60, reason="r")
    client.hold(ttl_seconds=60, reason="r", selector="vram>=40G")
    first, second = (kw["body"] for _, _, kw in http.calls)
    assert "device_id" not in first and "selector" not in first  # EXT-CLI-1
    assert second["selector"] == "vram>=40G"
    assert first["idempotency_key"] != second["idempotency_key"]  # EXT-CLI-4


@pytest.mark.parametrize(("ttl", "reason"), [(0, "r"), (-5, "r"), (60, ""), (60, "  ")])
def test_hold_refuses_what_cannot_be_a_hold(ttl: int, reason: str) -> None:
    client, http, _ = make(lambda m, p, kw: {"id": "h1"})
    with pytest.raises(ValueError):
        client.hold(ttl_seconds=ttl, reason=reason)
    assert http.calls == []
