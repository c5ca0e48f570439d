"""``--count`` and device lists on ``rc run`` and ``rc hold`` (EXT-GANG-1, EXT-GANG-6).

Usage errors are refused before any request (the controller address refuses, so a
request would show as ``connection refused``); the accepted forms run against a real
controller with a fake worker, and the views show the device list where a job has
several, the base columns where it has one.
"""

from __future__ import annotations

import re
import socket

import pytest

from cli.conftest import Rc
from client.live import FakeWorker, LiveController, until_killed
from resource_controller.client import api


def _dead(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("RC_CONTROLLER", url)
    monkeypatch.setenv("RC_TOKEN", "ctok")


HOLD = ["--ttl", "5m", "--reason", "r"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "--count", "0", "--", "true"], "at least 1"),
        (["run", "--count", "3", "-d", "b:gpu0,b:gpu1", "--", "true"], "does not match"),
        (["run", "--count", "2", "-d", "b:gpu0", "--", "true"], "comma list"),
        (["run", "-d", "a:gpu0,b:gpu1", "--", "true"], "one host"),
        (["run", "-d", "b:gpu0,b:gpu0", "--", "true"], "more than once"),
        (["run", "-d", "b:gpu0,", "--", "true"], "empty device"),
        (["hold", "b:gpu0,c:gpu1", *HOLD], "one host"),
        (["hold", "--count", "-1", *HOLD], "at least 1"),
    ],
)
def test_bad_counts_and_lists_are_usage_errors(
    run_rc: Rc, monkeypatch: pytest.MonkeyPatch, args: list[str], words: str
) -> None:
    _dead(monkeypatch)
    result = run_rc(*args)
    assert result.exit_code == 1, result.stderr
    assert words in result.stderr and "connection refused" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--count", "2", "--", "true"],
        ["run", "--count", "2", "-d", "b:gpu0,b:gpu1", "--", "true"],
        ["hold", "b:gpu0,b:gpu1", *HOLD],
        ["hold", "--count", "2", "--select", "kind=a", *HOLD],
    ],
)
def test_good_counts_and_lists_reach_the_request(
    run_rc: Rc, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    _dead(monkeypatch)
    assert "connection refused" in run_rc(*args).stderr


@pytest.fixture
def env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": "ctok", "RC_SUBMITTER": "tester"}


def test_run_with_a_count_and_with_a_list(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, controller: LiveController
) -> None:
    result = run_rc("run", "--count", "2", "--", "echo", "hi", env=env)
    assert result.exit_code == 0, result.stderr
    assert re.fullmatch(r"rc: job \S+ on box:gpu0,box:gpu1\n", result.stderr)
    result = run_rc("run", "-d", "box:gpu1,box:gpu0", "--", "true", env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.endswith(" on box:gpu0,box:gpu1\n")
    # No host has three: refused at submit (EXT-GANG-2).
    result = run_rc("run", "--count", "3", "--", "true", env=env)
    assert result.exit_code == 1 and "no_matching_device" in result.stderr, result.stderr
    listing = run_rc("jobs", env=env).stdout.splitlines()
    assert listing[1].split()[1] == "box:gpu0,box:gpu1"


def test_views_show_the_list_and_keep_the_base_for_one_device(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, controller: LiveController
) -> None:
    worker.behaviour = until_killed
    client = api.JsonClient(controller.url, "ctok", submitter="tester")
    gang = client.submit(["block"], count=2)
    assert gang["device_ids"] == ["box:gpu0", "box:gpu1"]
    single = client.submit(["train"], device="box:gpu1")
    ps = run_rc("ps", env=env).stdout.splitlines()
    assert ps[1].split()[:2] == [gang["id"], "box:gpu0,box:gpu1"]
    assert ps[2].split()[:2] == [single["id"], "box:gpu1"]  # one device: the base column
    text = run_rc("describe", "box:gpu1", env=env).stdout
    assert f"job {gang['id']} on box:gpu0,box:gpu1, running" in text
