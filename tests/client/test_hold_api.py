"""The submit of a hold (CLI-121, EXT-CLI-1, EXT-CLI-4), and what cannot be one."""

from __future__ import annotations

import pytest

from resource_controller.client import submit


def test_hold_body_is_exactly_a_hold() -> None:
    body = submit.hold(1800, "manual profiling", device="box:gpu0").body("alice@box")
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
    first = submit.hold(60, "r").body("me")
    second = submit.hold("1m", "r", select="vram>=40G").body("me")
    assert "device_id" not in first and "selector" not in first  # EXT-CLI-1
    assert second["selector"] == "vram>=40G" and second["max_runtime_seconds"] == 60
    assert first["idempotency_key"] != second["idempotency_key"]  # EXT-CLI-4


@pytest.mark.parametrize(("ttl", "reason"), [(0, "r"), (-5, "r"), (60, ""), (60, "  ")])
def test_hold_refuses_what_cannot_be_a_hold(ttl: int, reason: str) -> None:
    with pytest.raises(ValueError):
        submit.hold(ttl, reason)
