"""``rc usage``, ``Client.usage`` and a job's GPU figures on the client side (EXT-ACCT).

A live controller and a fake worker that reports what its jobs' GPUs did; the window
is real time here, so held times are a second or so: the tests read jobs and groups,
and the arithmetic is the store's and the controller's tests' (``test_usage.py``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cli.conftest import Rc
from client.live import CLIENT, FakeWorker, LiveController
from resource_controller import Usage
from resource_controller.cli import usage as usage_cli
from resource_controller.client.aio import AsyncClient
from resource_controller.client.sync import Client

GIB = 1 << 30
DEAD = {"RC_CONTROLLER": "http://127.0.0.1:9", "RC_TOKEN": CLIENT}


def measured(worker: FakeWorker, assignment: dict[str, Any]) -> tuple[Any, ...]:
    """Succeed, saying the GPU ran at 75 % with 6 GiB at most over 3 readings."""
    return (
        "succeeded",
        0,
        "",
        {"gpu_util_mean": 75.0, "gpu_mem_peak_bytes": 6 * GIB, "samples": 3},
    )


@pytest.fixture
def fleet(controller: LiveController) -> tuple[LiveController, dict[str, str]]:
    """Three jobs ended: two of alice's (one measured), one of bob's."""
    fake = FakeWorker(controller, behaviour=measured)
    client = Client(controller.url, CLIENT, submitter="alice")
    try:
        client.run(["true"], device="box:gpu0", capture=True)
        client.run(["true"], device="box:gpu1", capture=True)
        Client(controller.url, CLIENT, submitter="bob").run(["true"], capture=True)
    finally:
        fake.stop()
    return controller, {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT}


def test_rc_jobs_json_shows_what_the_gpus_did(
    run_rc: Rc, fleet: tuple[LiveController, dict[str, str]]
) -> None:
    # EXT-ACCT-1: rc jobs -o json carries the controller's fields as they are.
    _, env = fleet
    result = run_rc("jobs", "-o", "json", env=env)
    assert result.exit_code == 0, result.stderr
    jobs = json.loads(result.stdout)
    assert len(jobs) == 3
    assert {(j["gpu_util_mean"], j["gpu_mem_peak_bytes"], j["samples"]) for j in jobs} == {
        (75.0, 6 * GIB, 3)
    }
    (job,) = Client(fleet[0].url, CLIENT).jobs(limit=1)
    assert (job.gpu_util_mean, job.gpu_mem_peak_bytes, job.samples) == (75.0, 6 * GIB, 3)


def test_rc_usage_lists_a_line_per_submitter(
    run_rc: Rc, fleet: tuple[LiveController, dict[str, str]]
) -> None:
    _, env = fleet
    result = run_rc("usage", env=env)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SUBMITTER", "JOBS", "DEVICE-HOURS", "GPU-HOURS", "SHARE"]
    rows = {line.split()[0]: line.split()[1] for line in lines[1:-1]}
    assert rows == {"alice": "2", "bob": "1", "(all)": "3"}
    assert lines[-1].startswith("jobs that ended from ")


def test_rc_usage_json_is_the_controllers_answer_on_one_line(
    run_rc: Rc, fleet: tuple[LiveController, dict[str, str]]
) -> None:
    _, env = fleet
    result = run_rc("usage", "--since", "1d", "--by", "host", "-o", "json", env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("\n") == 1
    answer = json.loads(result.stdout)
    assert answer["by"] == "host"
    assert [(g["group"], g["jobs"]) for g in answer["groups"]] == [("box", 3)]
    assert set(answer["total"]) >= {"jobs", "device_hours"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "7x"], "rc: --since: '7x' is not a duration (examples: 7d, 36h, 2w"),
        (["--since", "last week"], "rc: --since: 'last week' is not a duration"),
        (["--since", "0d"], "rc: --since: '0d' must be at least one second"),
        (["--by", "user"], "rc: --by: 'user' is not one of submitter, device, host"),
        (["-o", "yaml"], 'rc: unknown output format "yaml"'),
    ],
)
def test_rc_usage_refuses_a_bad_flag_before_any_request(
    run_rc: Rc, args: list[str], says: str
) -> None:
    result = run_rc("usage", *args, env=DEAD)  # nothing listens there: no request made
    assert result.exit_code == 1
    assert result.stderr.startswith(says), result.stderr
    assert result.stderr.count("\n") == 1


def test_the_python_apis_answer_usage(fleet: tuple[LiveController, dict[str, str]]) -> None:
    # EXT-PYAPI-1, EXT-ACCT-2: typed results, the same answer sync and async.
    controller, _ = fleet
    got = Client(controller.url, CLIENT).usage("1d", by="device")
    assert isinstance(got, Usage) and got.by == "device"
    assert sorted((g.group, g.jobs) for g in got.groups) == [("box:gpu0", 2), ("box:gpu1", 1)]
    assert got.total.jobs == 3 and got.more == 0
    assert got.since is not None and got.until is not None and got.since < got.until

    async def aio() -> Usage:
        async with AsyncClient(controller.url, CLIENT) as c:
            return await c.usage()

    by_submitter = asyncio.run(aio())
    assert {g.group: g.jobs for g in by_submitter.groups} == {"alice": 2, "bob": 1}
    assert all(g.share is not None or g.device_hours == 0 for g in by_submitter.groups)


def test_the_python_api_refuses_a_bad_window_before_any_request() -> None:
    client = Client("http://127.0.0.1:9", CLIENT)
    with pytest.raises(ValueError, match="since: 'a week' is not a duration"):
        client.usage("a week")
    with pytest.raises(ValueError, match="by: 'user'"):
        client.usage(by="user")


def test_the_table_says_unknown_gpu_hours_and_groups_left_out() -> None:
    answer = {
        "by": "device",
        "since": "2027-01-08T09:00:00Z",
        "until": "2027-01-15T09:30:00Z",
        "groups": [
            {"group": "box:gpu0", "jobs": 4, "device_hours": 12.25, "gpu_hours": 6.1, "share": 0.8},
            {"group": "box:gpu1", "jobs": 1, "device_hours": 3.0, "share": 0.196},
        ],
        "total": {"jobs": 6, "device_hours": 15.3, "gpu_hours": 6.1},
        "more": 1,
    }
    assert usage_cli.text(answer).splitlines() == [
        "DEVICE    JOBS  DEVICE-HOURS  GPU-HOURS  SHARE",
        "box:gpu0  4     12.2          6.1        80.0%",
        "box:gpu1  1     3.0           -          19.6%",
        "(all)     6     15.3          6.1        100.0%",
        "... and 1 smaller group(s), counted in (all)",
        "jobs that ended from 2027-01-08T09:00:00Z to 2027-01-15T09:30:00Z",
    ]
    empty = {"by": "host", "since": "a", "until": "b", "groups": [], "total": {"jobs": 0}}
    assert usage_cli.text(empty) == "no device was held by a job that ended from a to b\n"
