"""``count`` and ``device_ids`` on the submit route and in what it answers (EXT-GANG-6)."""

from __future__ import annotations

from typing import Any

import pytest
from controller_harness import Harness, assert_error

DEVICES = ("gpu0", "gpu1", "gpu2")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"device_ids": ["gpubox:gpu0", "gpubox:gpu1"], "device_id": "gpubox:gpu0"}, "device_id"),
        ({"device_ids": ["gpubox:gpu0", "gpubox:gpu1"], "selector": "a=b"}, "selector"),
        ({"device_ids": ["gpubox:gpu0", "gpubox:gpu1"], "count": 3}, "does not match"),
        ({"device_ids": ["gpubox:gpu0", "gpubox:gpu1"], "count": 1}, "does not match"),
        ({"device_ids": ["gpubox:gpu0", "other:gpu1"]}, "one host"),
        ({"device_ids": ["gpubox:gpu0", "gpubox:gpu0"]}, "more than once"),
        # EXT-MIG-3: never leasable at once, so never startable.
        ({"device_ids": ["gpubox:gpu0.mig1", "gpubox:gpu0"]}, "names one GPU twice"),
        ({"count": 0}, "count"),
        ({"count": -2}, "count"),
        ({"count": 2, "device_id": "gpubox:gpu0"}, "device_ids"),
        ({"count": "2"}, "count"),
    ],
)
def test_contradictions_are_bad_requests(rc: Harness, fields: dict[str, Any], words: str) -> None:
    rc.register(devices=DEVICES)
    message = assert_error(rc.submit_raw(**fields), 400, "bad_request")
    assert words in message, message


def test_no_single_host_could_ever_hold_it(rc: Harness) -> None:
    rc.register(devices=DEVICES)
    rc.register(host="other", devices=("gpu0", "gpu1"))
    message = assert_error(rc.submit_raw(count=4), 400, "no_matching_device")
    assert "4" in message


def test_the_answer_and_the_assignment_carry_the_list(rc: Harness) -> None:
    wid = rc.register(devices=DEVICES)
    job = rc.submit(count=2)
    assert job["state"] == "assigned"
    assert job["device_ids"] == ["gpubox:gpu0", "gpubox:gpu1"]
    assert job["device_id"] == "gpubox:gpu0"
    (assignment,) = rc.poll(wid).json()["assignments"]
    assert assignment["device_ids"] == job["device_ids"]
    assert assignment["device_id"] == "gpubox:gpu0"
    assert assignment["lease_epoch"] == job["lease_epoch"]
    pinned = rc.submit(device_ids=["gpubox:gpu2", "gpubox:gpu0"])
    assert pinned["state"] == "queued" and pinned["device_ids"] == ["gpubox:gpu0", "gpubox:gpu2"]
    # A queued job that has no device yet carries no list.
    waiting = rc.submit(count=3)
    assert "device_ids" not in waiting
