"""The one submit spec: its fields are the controller's, each is checked before any
request naming what the caller gave it, and the body carries what is set (CLI-072..074,
EXT-GANG-1, EXT-SHARE-2, EXT-LIMITS-1)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from resource_controller import wire
from resource_controller.client import machine, submit
from resource_controller.core import limits


def test_the_fields_and_defaults_are_the_controllers_model() -> None:
    model = {name: f.default for name, f in wire.SubmitRequest.model_fields.items()}
    assert model == submit.FIELDS
    assert (limits.SECONDS.high, limits.AFTER.count) == (submit.MAX_CEILING, submit.AFTER_MAX)


def test_the_body_omits_defaults_and_carries_a_key_made_once() -> None:
    spec = submit.Submit(["python", "train.py"], device="box:gpu0")
    body = spec.body("alice@box")
    assert set(body) == {"device_id", "command", "submitter", "idempotency_key"}
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
        body["idempotency_key"],
    )
    assert spec.body("alice@box") == body  # a retry is the same request (CLI-074)
    assert submit.Submit(["x"]).idempotency_key != spec.idempotency_key
    hold = submit.Submit(None, kind="hold").body("")
    assert set(hold) == {"submitter", "kind", "idempotency_key"}  # no command at all


def test_the_body_carries_every_set_field() -> None:
    spec = submit.Submit(
        ["a"],
        select="vram>=40G",
        cwd="/w",
        env={"A": "1"},
        priority=-3,
        max_runtime="1m30s",
        idle_timeout=5.9,
        no_wait=True,
        stdio="tty",
        count=2,
    )
    body = spec.body("me", after=["j1"])
    assert {k: body[k] for k in body if k != "idempotency_key"} == {
        "selector": "vram>=40G",
        "command": ["a"],
        "cwd": "/w",
        "env": {"A": "1"},
        "submitter": "me",
        "priority": -3,
        "max_runtime_seconds": 90,
        "idle_timeout_seconds": 5,  # whole seconds, toward zero (CLI-073)
        "no_wait": True,
        "stdio": "tty",
        "count": 2,
        "after": ["j1"],
    }


@pytest.mark.parametrize(
    ("device", "count", "expected"),
    [
        ("", 1, ("", (), 1)),
        ("", 3, ("", (), 3)),
        ("b:gpu0", 1, ("b:gpu0", (), 1)),
        (["b:gpu0"], 1, ("b:gpu0", (), 1)),
        (["b:gpu1", "b:gpu0"], 1, ("", ("b:gpu0", "b:gpu1"), 2)),
        ("b:gpu1, b:gpu0", 2, ("", ("b:gpu0", "b:gpu1"), 2)),
    ],
)
def test_a_device_list_implies_its_count(
    device: str | list[str], count: int, expected: tuple[str, tuple[str, ...], int]
) -> None:  # EXT-GANG-1
    assert submit.devices(device, "", count) == expected
    spec = submit.Submit(["x"], device=device, count=count)
    assert "count" not in spec.body("me") or not spec.device_ids


@pytest.mark.parametrize(
    ("kw", "api_words", "cli_words"),
    [
        ({"device": "b:gpu0", "select": "s"}, "device and select", "-d/--device and --select"),
        ({"count": 0}, "count must be at least 1", "--count must be at least 1"),
        ({"device": "b:gpu0", "count": 2}, "one device", "--count 2 with one device"),
        ({"device": ["b:gpu0", "b:gpu1"], "count": 3}, "does not match", "does not match"),
        ({"device": ["b:gpu0", "b:gpu0"]}, "more than once", "more than once"),
        ({"device": "a:gpu0,b:gpu0"}, "one host", "one host"),
        ({"device": "a:gpu0,,a:gpu1"}, "empty device ID", "empty device ID"),
        ({"max_runtime": "0.5s"}, "max_runtime must be at least 1s", "--max-runtime must be at"),
        ({"idle_timeout": 2**31}, "idle_timeout must be at most", "--idle-timeout must be at"),
        ({"max_runtime": -1}, "negative", "negative"),
        ({"max_runtime": "2d"}, "invalid max_runtime", "invalid --max-runtime"),
        ({"after_any": True}, "after_any needs after", "--after-any needs --after"),
        ({"after": "a1b2c3", "no_wait": True}, "cannot be used together", "--no-wait"),
        ({"after": "a,,b"}, "after has an empty job ID", "--after has an empty job ID"),
        ({"after": [f"j{i}" for i in range(65)]}, "at most 64", "at most 64"),
    ],
)
def test_each_refusal_names_what_the_caller_gave(
    kw: dict[str, Any], api_words: str, cli_words: str
) -> None:
    with pytest.raises(submit.BadSubmit, match=api_words):
        submit.Submit(["x"], **kw)
    with pytest.raises(ValueError, match=re.escape(cli_words)):
        submit.Submit(["x"], names=submit.CLI, **kw)


def test_after_takes_ids_prefixes_handles_and_lists_of_them() -> None:
    class Handle:
        id = "d4e5f6"

    assert submit.after_ids(None, False, False) == []
    assert submit.after_ids("abc123, def456,abc123", False, False) == ["abc123", "def456"]
    assert submit.after_ids(Handle(), False, False) == ["d4e5f6"]
    assert submit.after_ids(["abc123", Handle()], True, False) == ["abc123", "d4e5f6"]
    for bad in (42, [42]):
        with pytest.raises(TypeError, match="job IDs or jobs"):
            submit.after_ids(bad, False, False)


def test_argv_is_a_list_of_strings() -> None:
    with pytest.raises(TypeError, match="list of strings"):
        submit.argv("python train.py")
    with pytest.raises(ValueError, match="non-empty"):
        submit.argv([])


def test_a_count_the_controller_ignored_is_caught() -> None:
    placed = {"id": "j", "state": "assigned", "device_id": "b:gpu0"}
    assert "does not support count" in machine.count_shortfall(placed, 2)
    assert machine.count_shortfall(placed, 1) == ""
    assert machine.count_shortfall({**placed, "device_ids": ["b:gpu0", "b:gpu1"]}, 2) == ""
    assert machine.count_shortfall({**placed, "state": "queued"}, 2) == ""
