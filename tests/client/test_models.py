"""The Python API's typed views, without a controller (EXT-PYAPI-1)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from resource_controller.client import machine, models


def job(**fields: object) -> models.JobInfo:
    info = models.JobInfo("j1")
    info._load({"id": "j1", "state": "running", "command": ["x"], **fields})
    return info


def test_omitted_fields_read_as_their_empty_values() -> None:  # API-020
    info = job()
    assert (info.exit_code, info.kill_reason, info.lease_epoch, info.env) == (None, "", 0, {})
    assert info.device_ids == [] and info.started_at is None and not info.terminal


def test_fields_are_typed_and_unknown_keys_kept() -> None:
    info = job(
        device_id="box:gpu1",
        exit_code=0,
        state="succeeded",
        lease_epoch=7,
        started_at="2026-08-13T14:30:00Z",
        future_field={"a": 1},
    )
    assert info.succeeded and info.terminal and info.exit_code == 0
    assert info.device_ids == ["box:gpu1"]  # a base controller sends no list (EXT-GANG-6)
    assert info.started_at == datetime(2026, 8, 13, 14, 30, tzinfo=UTC)
    assert info.raw["future_field"] == {"a": 1}
    assert job(device_id="b:gpu0", device_ids=["b:gpu0", "b:gpu1"]).device_ids == [
        "b:gpu0",
        "b:gpu1",
    ]


def test_queue_facts_only_while_queued() -> None:
    info = models.JobInfo("j")
    info._load({"id": "j", "state": "queued"}, 3, [{"device_id": "b:gpu0", "holder": "al"}])
    assert info.queue_position == 3 and info.waiting_for[0]["holder"] == "al"
    info._load({"id": "j", "state": "running"}, 3, [{"device_id": "b:gpu0"}])
    assert info.queue_position == 0 and info.waiting_for == []


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"state": "succeeded", "exit_code": 0}, 0),
        ({"state": "succeeded"}, 0),
        ({"state": "failed", "exit_code": 3}, 3),
        ({"state": "failed", "exit_code": -1}, 255),
        ({"state": "failed", "exit_code": 512}, 1),
        ({"state": "killed", "exit_code": 143}, 143),
        ({"state": "killed"}, 1),
        ({"state": "lost"}, 1),
    ],
)
def test_run_exit_code_is_rc_runs(fields: dict[str, object], code: int) -> None:  # CLI-050
    assert machine.ended({"id": "j1", **fields}).code == code


def test_a_lease_reports_the_workers_cuda_index_and_env() -> None:  # WRK-077, EXT-GANG-4
    lease = models.LeaseInfo.from_job(
        job(device_id="b:gpu1", device_ids=["b:gpu3", "b:gpu1"], lease_epoch=9)
    )
    assert lease.device_ids == ["b:gpu1", "b:gpu3"] and lease.cuda_visible_devices == "1,3"
    assert lease.env == {
        "RC_DEVICE": "b:gpu1",
        "RC_DEVICES": "b:gpu1,b:gpu3",
        "CUDA_VISIBLE_DEVICES": "1,3",
        "RC_LEASE_EPOCH": "9",
    }
    plain = models.LeaseInfo.from_job(job(device_id="b:nvme"))
    assert plain.cuda_visible_devices is None and "CUDA_VISIBLE_DEVICES" not in plain.env


def test_a_lease_on_mig_instances_reports_their_uuids() -> None:  # EXT-MIG-2
    ids = ["b:gpu0.mig1", "b:gpu0.mig0"]
    assert models.mig_instance_ids([*ids, "b:gpu1"]) == ids
    lease = models.LeaseInfo.from_job(
        job(device_id="b:gpu0.mig0", device_ids=ids),
        {"gpu0.mig0": "MIG-a", "gpu0.mig1": "MIG-b"},
    )
    assert lease.cuda_visible_devices == "MIG-a,MIG-b"
    # Without the UUIDs it says nothing rather than GPU 0 and GPU 1.
    unknown = models.LeaseInfo.from_job(job(device_id="b:gpu0.mig1"))
    assert unknown.cuda_visible_devices is None and "CUDA_VISIBLE_DEVICES" not in unknown.env
    describe = {
        "labels": [
            {"key": "uuid", "value": "MIG-declared", "source": "declared"},
            {"key": "uuid", "value": "MIG-x", "source": "detected"},
        ]
    }
    assert models.detected_uuid(describe) == "MIG-x"
    assert models.detected_uuid({"labels": None}) == ""


def test_devices_read_labels_as_selectors_do() -> None:
    device = models.Device.from_view(
        {
            "device": {
                "id": "b:gpu0",
                "state": "ready",
                "labels": [
                    {"key": "vram", "value": "8G", "source": "declared"},
                    {"key": "vram", "value": "16G", "source": "detected"},
                ],
            },
            "elapsed_seconds": 0,
        }
    )
    assert device.label_map == {"vram": "16G"} and device.free
    assert not models.Device.from_view({"device": {"state": "ready"}, "job_id": "j"}).free


def test_an_explanation_carries_the_no_match_hint() -> None:
    empty = {"selector": "model=H100", "matching": [], "free": [], "queue_depth": 0}
    hint = "model has 'NVIDIA H100 80GB HBM3' (2 devices)"
    assert models.Explanation.from_json({**empty, "hint": hint}, "model=H100").hint == hint
    assert models.Explanation.from_json(empty, "model=H100").hint == ""  # an older controller
