"""Every bounded wire field: at its limit accepted, one past it refused (EXT-LIMITS-1, -2).

The expected numbers are written here from the spec, not read from ``core.limits``, so
a changed limit fails this test; the cases are checked through ``parse_model``, the path
every route takes, so a field that lost its constraint fails too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resource_controller import errors, wire
from resource_controller.controller.deps import parse_model
from resource_controller.core import limits

KIB = 1024

#: (model, field, limit in bytes) for strings measured in UTF-8 bytes (EXT-LIMITS-2).
TEXT_LIMITS = [
    (wire.SubmitRequest, "cwd", 4 * KIB),
    (wire.SubmitRequest, "selector", 4 * KIB),
    (wire.SubmitRequest, "submitter", KIB),
    (wire.SubmitRequest, "reason", KIB),
    (wire.SubmitRequest, "idempotency_key", 256),
    (wire.KillRequest, "submitter", KIB),
]
#: (model, field, low, high) for integers (EXT-LIMITS-1; exit codes are 32-bit).
INT_LIMITS = [
    (wire.SubmitRequest, "max_runtime_seconds", 0, 2147483647),
    (wire.SubmitRequest, "idle_timeout_seconds", 0, 2147483647),
    (wire.StatusReport, "exit_code", -2147483648, 2147483647),
]
COMMAND_ARGS, COMMAND_BYTES = 4096, 256 * KIB
ENV_ENTRIES, ENV_BYTES = 1024, 256 * KIB
NAME_CHARS = 128


def _parse(model: type[Any], body: dict[str, Any]) -> Any:
    return parse_model(json.dumps(body).encode(), model)


def _refused(model: type[Any], body: dict[str, Any], *words: str) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        _parse(model, body)
    for word in words:
        assert word in caught.value.message, (word, caught.value.message)


@st.composite
def text_of_bytes(draw: st.DrawFn, size: int) -> str:
    """A string of exactly ``size`` UTF-8 bytes, mixing 1- to 4-byte characters."""
    wide = st.sampled_from(["a", "é", "€", "𝄞", "/", " ", "\\", '"', "\n"])
    out: list[str] = []
    used = 0
    for ch in draw(st.lists(wide, max_size=64)):
        n = len(ch.encode())
        if used + n > size:
            break
        out.append(ch)
        used += n
    out.append("x" * (size - used))
    return "".join(draw(st.permutations(out)))


def test_the_code_table_holds_the_spec_numbers() -> None:
    assert (limits.SECONDS.low, limits.SECONDS.high) == (0, 2147483647)
    assert limits.BODY_BYTES == 1048576
    assert (limits.COMMAND.count, limits.COMMAND.size) == (COMMAND_ARGS, COMMAND_BYTES)
    assert (limits.ENV.count, limits.ENV.size) == (ENV_ENTRIES, ENV_BYTES)
    assert limits.CWD.size == limits.SELECTOR.size == 4096
    assert limits.SUBMITTER.size == limits.REASON.size == 1024
    assert limits.IDEMPOTENCY_KEY.size == 256
    assert limits.NAME_CHARS == NAME_CHARS


@pytest.mark.parametrize(("model", "field", "size"), TEXT_LIMITS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_text_fields_at_and_past_their_byte_limit(
    model: type[Any], field: str, size: int, data: st.DataObject
) -> None:
    at = data.draw(text_of_bytes(size))
    assert len(at.encode()) == size
    assert getattr(_parse(model, {field: at}), field) == at
    past = at + data.draw(st.sampled_from(["x", "é", "𝄞"]))
    _refused(model, {field: past}, field, str(size))


@pytest.mark.parametrize(("model", "field", "low", "high"), INT_LIMITS)
def test_integer_fields_at_and_past_their_range(
    model: type[Any], field: str, low: int, high: int
) -> None:
    for ok in (low, high):
        assert getattr(_parse(model, {field: ok}), field) == ok
    for bad in (low - 1, high + 1, 10**30, -(10**30)):
        _refused(model, {field: bad}, field, f"{low}..{high}")


def test_device_ceiling_at_registration() -> None:
    for ok in (0, 2147483647):
        [d] = _parse(
            wire.RegisterRequest, {"devices": [{"name": "g", "max_runtime_seconds": ok}]}
        ).devices
        assert d.max_runtime_seconds == ok
    for bad in (-1, 2147483648, 10**30):
        body = {"devices": [{"name": "g", "max_runtime_seconds": bad}]}
        _refused(wire.RegisterRequest, body, "devices.0.max_runtime_seconds", "2147483647")


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_command_count_and_total_bytes(data: st.DataObject) -> None:
    args = ["a"] * COMMAND_ARGS
    assert len(_parse(wire.SubmitRequest, {"command": args}).command) == COMMAND_ARGS
    _refused(wire.SubmitRequest, {"command": [*args, "a"]}, "command", str(COMMAND_ARGS))
    split = data.draw(st.integers(1, 64))
    total = data.draw(text_of_bytes(COMMAND_BYTES - split))
    big = [total, "y" * split]
    assert _parse(wire.SubmitRequest, {"command": big}).command == big
    _refused(wire.SubmitRequest, {"command": [*big, "z"]}, "command", str(COMMAND_BYTES))


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_env_count_and_total_bytes(data: st.DataObject) -> None:
    env = {f"K{i}": "" for i in range(ENV_ENTRIES)}
    assert len(_parse(wire.SubmitRequest, {"env": env}).env) == ENV_ENTRIES
    _refused(wire.SubmitRequest, {"env": {**env, "X": ""}}, "env", str(ENV_ENTRIES))
    value = data.draw(text_of_bytes(ENV_BYTES - 1))
    assert _parse(wire.SubmitRequest, {"env": {"K": value}}).env == {"K": value}
    _refused(wire.SubmitRequest, {"env": {"KK": value}}, "env", str(ENV_BYTES))


NAME_ALPHABET = st.sampled_from("ABCXYZabcxyz0189._-")
OUTSIDE = st.characters(
    exclude_categories=["Cs"],
    exclude_characters="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-",
)
NAME_SHAPES: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
    ("host", lambda n: {"host": n}),
    ("devices.0.name", lambda n: {"host": "h", "devices": [{"name": n}]}),
]
PUSH_SHAPES: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
    ("host", lambda n: {"host": n}),
    ("devices.0", lambda n: {"host": "h", "devices": [n]}),
]


@settings(max_examples=40, deadline=None)
@given(
    name=st.text(NAME_ALPHABET, min_size=1, max_size=NAME_CHARS),
    bad=OUTSIDE,
    at=st.integers(0, NAME_CHARS),
)
def test_host_and_device_names(name: str, bad: str, at: int) -> None:
    """At most 128 characters of A-Z a-z 0-9 . _ - ; anything else is refused naming it."""
    for model, shapes in ((wire.RegisterRequest, NAME_SHAPES), (wire.LabelsPush, PUSH_SHAPES)):
        for where, shape in shapes:
            _parse(model, shape(name))
            _parse(model, shape(name[0] * NAME_CHARS))
            _refused(model, shape(name[0] * (NAME_CHARS + 1)), where, str(NAME_CHARS))
            base = name[: NAME_CHARS - 1]
            cut = at % (len(base) + 1)
            _refused(model, shape(base[:cut] + bad + base[cut:]), where)
