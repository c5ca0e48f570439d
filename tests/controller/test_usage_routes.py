"""Accounting over HTTP (EXT-ACCT): the outcome's GPU fields, ``GET /v1/usage``, ``/metrics``.

A real controller on loopback (``controller_harness``), on the suite's backend; time
moves only through its ``FakeClock``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from controller_harness import Harness, assert_empty_ok, assert_error
from prometheus_client.parser import text_string_to_metric_families

GIB = 1 << 30


def finished(rc: Harness, seconds: int, submitter: str = "alice", **gpu: Any) -> str:
    """A job on gpubox:gpu0 held ``seconds`` and reported succeeded with ``gpu``."""
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    job = rc.submit(device_id="gpubox:gpu0", submitter=submitter)
    assert [a["job_id"] for a in rc.take(wid)] == [job["id"]]
    rc.clock.advance(seconds)
    assert_empty_ok(rc.report(job["id"], wid, "succeeded", exit_code=0, **gpu))
    return str(job["id"])


def test_the_outcome_carries_gpu_use_to_the_job_view(rc: Harness) -> None:
    # EXT-ACCT-1: on the job's view and in listings, as the worker reported them.
    job_id = finished(rc, 60, gpu_util_mean=87.5, gpu_mem_peak_bytes=20 * GIB, samples=6)
    job = rc.job(job_id)
    assert (job["gpu_util_mean"], job["gpu_mem_peak_bytes"], job["samples"]) == (
        87.5,
        20 * GIB,
        6,
    )
    (listed,) = rc.client.get("/v1/jobs").json()["jobs"]
    assert listed["gpu_util_mean"] == 87.5 and listed["samples"] == 6


def test_nothing_sampled_means_the_fields_are_absent(rc: Harness) -> None:
    # EXT-ACCT-1: absent, not zero; a reference worker's outcome (no such fields) too.
    job = rc.job(finished(rc, 5))
    assert not {"gpu_util_mean", "gpu_mem_peak_bytes", "samples"} & set(job)


@pytest.mark.parametrize(
    "gpu",
    [
        {"gpu_util_mean": 250.0, "gpu_mem_peak_bytes": -1, "samples": 1.5},
        {"gpu_util_mean": "87", "gpu_mem_peak_bytes": "big", "samples": True},
        {"gpu_util_mean": None, "gpu_mem_peak_bytes": [], "samples": {"n": 1}},
    ],
)
def test_a_bad_measurement_is_unknown_and_never_costs_the_outcome(
    rc: Harness, gpu: dict[str, Any]
) -> None:
    # A refused terminal report would be retried for ever with the device held; a bad
    # reading is dropped instead, and the outcome lands.
    job = rc.job(finished(rc, 5, **gpu))
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert not {"gpu_util_mean", "gpu_mem_peak_bytes", "samples"} & set(job)


def test_usage_groups_by_submitter_device_and_host(rc: Harness) -> None:
    # EXT-ACCT-2: jobs, device-hours, utilisation-weighted GPU-hours where known, share.
    finished(rc, 3600, "alice", gpu_util_mean=50.0, samples=360)
    finished(rc, 1800, "bob")
    r = rc.client.get("/v1/usage")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["by"] == "submitter"
    assert body["since"] == "2027-01-08T09:00:00Z" and body["until"] == "2027-01-15T09:30:00Z"
    assert body["groups"] == [
        {
            "group": "alice",
            "jobs": 1,
            "device_hours": 1.0,
            "gpu_hours": 0.5,
            "sampled_device_hours": 1.0,
            "share": 0.6667,
        },
        {"group": "bob", "jobs": 1, "device_hours": 0.5, "share": 0.3333},
    ]
    assert body["total"] == {
        "jobs": 2,
        "device_hours": 1.5,
        "gpu_hours": 0.5,
        "sampled_device_hours": 1.0,
    }
    assert "more" not in body
    by_device = rc.client.get("/v1/usage", params={"by": "device", "since": "1d"}).json()
    assert [(g["group"], g["jobs"]) for g in by_device["groups"]] == [("gpubox:gpu0", 2)]
    by_host = rc.client.get("/v1/usage", params={"by": "host", "limit": "1"}).json()
    assert [g["group"] for g in by_host["groups"]] == ["gpubox"]


def test_usage_limit_counts_the_rest_in_more(rc: Harness) -> None:
    finished(rc, 100, "alice")
    finished(rc, 50, "bob")
    body = rc.client.get("/v1/usage", params={"limit": "1"}).json()
    assert [g["group"] for g in body["groups"]] == ["alice"]
    assert body["more"] == 1 and body["total"]["jobs"] == 2


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"since": "7x"}, "since"),
        ({"since": "-1d"}, "since"),
        ({"since": "0s"}, "since"),
        ({"since": "9" * 5000 + "d"}, "since"),
        ({"by": "pair"}, "by"),
        ({"by": "user"}, "by"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "9" * 5000}, "limit"),
    ],
)
def test_usage_refuses_a_bad_question_naming_it(
    rc: Harness, params: dict[str, str], names: str
) -> None:
    message = assert_error(rc.client.get("/v1/usage", params=params), 400, "bad_request")
    assert message.startswith(names), message


def test_usage_needs_a_client_token(rc: Harness) -> None:
    assert_error(rc.anon.get("/v1/usage"), 401, "unauthorized")
    assert_error(rc.worker.get("/v1/usage"), 403, "forbidden")


def test_metrics_held_seconds_and_gpu_util_by_device_and_submitter(rc: Harness) -> None:
    # EXT-ACCT-3.
    finished(rc, 120, "alice", gpu_util_mean=42.0, samples=12)
    finished(rc, 30, "bob")
    text = rc.client.get("/metrics").text
    samples = {
        (s.name, s.labels.get("device"), s.labels.get("submitter")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("rc_device_held_seconds", "rc_job_gpu_util"))
    }
    assert samples == {
        ("rc_device_held_seconds_total", "gpubox:gpu0", "alice"): 120.0,
        ("rc_device_held_seconds_total", "gpubox:gpu0", "bob"): 30.0,
        ("rc_job_gpu_util", "gpubox:gpu0", "alice"): 42.0,
    }


def test_the_usage_answer_matches_its_published_schema(rc: Harness) -> None:
    # EXT-LIMITS-5: the document describes the route, its query and its answer.
    finished(rc, 10, gpu_util_mean=1.0, samples=1)
    doc = rc.client.get("/openapi.json").json()
    op = doc["paths"]["/v1/usage"]["get"]
    assert {p["name"] for p in op["parameters"]} >= {"since", "by", "limit"}
    schema = doc["components"]["schemas"]["UsageBody"]
    body = rc.client.get("/v1/usage").json()
    assert set(body) <= set(schema["properties"]), json.dumps(body)
