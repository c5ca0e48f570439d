"""The controller reads the reference worker's and client's ``null`` lists and maps as empty.

EXT-COMPAT-1: the reference encoder writes ``null`` for an empty map or list, at any
depth. The inputs are built by walking each request model's field annotations, so a
field added later is covered without touching this file.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resource_controller import errors, wire
from resource_controller.controller.deps import parse_model

Pair = tuple[Any, Any]


def _request_models() -> list[type[pydantic.BaseModel]]:
    found: list[type[pydantic.BaseModel]] = []
    todo = list(wire._Request.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__name__)


REQUEST_MODELS = _request_models()


def _split(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without Annotated and None, whether it admits None)."""
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            arms = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = optional or len(arms) < len(typing.get_args(annotation))
            assert len(arms) == 1, f"unexpected union {annotation!r}: teach this test about it"
            annotation = arms[0]
        else:
            return annotation, optional


def _container(annotation: Any) -> type | None:
    shape, _ = _split(annotation)
    origin = typing.get_origin(shape) or shape
    return origin if origin in (list, dict) else None


def _pairs(annotation: Any) -> st.SearchStrategy[Pair]:
    """(value as the reference sends it, the same value with every null list/map empty).

    Each list or map position is either ``null`` (paired with its empty container) or a
    small container of such pairs.
    """
    shape, optional = _split(annotation)
    origin = typing.get_origin(shape) or shape
    args = typing.get_args(shape)
    if origin is list:
        items = st.lists(_pairs(args[0]), max_size=3).map(
            lambda ps: ([a for a, _ in ps], [b for _, b in ps])
        )
        return st.just((None, [])) | items
    if origin is dict:
        entries = st.dictionaries(st.text(max_size=3), _pairs(args[1]), max_size=3).map(
            lambda d: ({k: a for k, (a, _) in d.items()}, {k: b for k, (_, b) in d.items()})
        )
        return st.just((None, {})) | entries
    if isinstance(shape, type) and issubclass(shape, pydantic.BaseModel):
        objects = _object_pairs(shape)
        return (st.just((None, None)) | objects) if optional else objects
    if shape is bool:
        base: st.SearchStrategy[Any] = st.booleans()
    elif shape is int:
        base = st.integers(0, 5)
    elif shape is float:  # a measurement (EXT-ACCT-1)
        base = st.floats(0, 100)
    elif shape is str:
        base = st.text(max_size=4)
    else:
        raise AssertionError(f"no strategy for {shape!r}: teach this test about it")
    # API-001: null for an optional scalar means absent, the same on both sides.
    return (st.none() | base if optional else base).map(lambda v: (v, v))


def _object_pairs(model: type[pydantic.BaseModel]) -> st.SearchStrategy[Pair]:
    required = {n: _pairs(f.annotation) for n, f in model.model_fields.items() if f.is_required()}
    optional = {
        n: _pairs(f.annotation) for n, f in model.model_fields.items() if not f.is_required()
    }

    def split(d: dict[str, Pair]) -> Pair:
        return {k: a for k, (a, _) in d.items()}, {k: b for k, (_, b) in d.items()}

    return st.fixed_dictionaries(required, optional=optional).map(split)


def _canon(annotation: Any, value: Any) -> Any:
    """A validated value with "not sent" (None) on a list/map field read as its empty form.

    The routes treat an unsent list/map field exactly as an empty one (for labels and
    sheets an empty map names no device, so both leave stored facts alone: API-032).
    """
    shape, _ = _split(annotation)
    origin = typing.get_origin(shape) or shape
    args = typing.get_args(shape)
    if origin is list:
        return [_canon(args[0], v) for v in (value or [])]
    if origin is dict:
        return {k: _canon(args[1], v) for k, v in (value or {}).items()}
    if isinstance(shape, type) and issubclass(shape, pydantic.BaseModel) and value is not None:
        return {n: _canon(f.annotation, getattr(value, n)) for n, f in shape.model_fields.items()}
    return value


def _outcome(model: type[pydantic.BaseModel], data: Any) -> Any:
    try:
        return _canon(model, model.model_validate(data))
    except pydantic.ValidationError:
        return "refused"


def test_every_request_model_is_covered() -> None:
    names = {m.__name__ for m in REQUEST_MODELS}
    assert {"RegisterRequest", "LabelsPush", "HeartbeatRequest", "SubmitRequest"} <= names
    with_containers = {
        m.__name__
        for m in REQUEST_MODELS
        if any(_container(f.annotation) for f in m.model_fields.values())
    }
    assert {"RegisterRequest", "LabelsPush", "HeartbeatRequest", "SubmitRequest"} <= with_containers


@pytest.mark.parametrize("model", REQUEST_MODELS, ids=lambda m: m.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_null_list_or_map_at_any_depth_means_empty(
    model: type[pydantic.BaseModel], data: st.DataObject
) -> None:
    """EXT-COMPAT-1: a body with nulls is accepted or refused exactly as the same body with
    each null list/map written empty, and when accepted it reads the same."""
    nulled, emptied = data.draw(_object_pairs(model))
    got = _outcome(model, nulled)
    assert got == _outcome(model, emptied), (nulled, emptied)


@pytest.mark.parametrize("model", REQUEST_MODELS, ids=lambda m: m.__name__)
def test_every_list_and_map_field_null_at_once_is_accepted(
    model: type[pydantic.BaseModel],
) -> None:
    """Each list/map field null, and one level down a null in every list/map slot."""
    body: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        shape, _ = _split(f.annotation)
        kind = _container(shape)
        args = typing.get_args(shape)
        if kind is None:
            if f.is_required():
                body[name] = {int: 1, str: "x", bool: True}[shape]
            continue
        inner = args[-1]
        body[name] = None
        if _container(inner):
            body[name] = [None] if kind is list else {"": None, "gpu0": None}
        parsed = model.model_validate(body)
        assert _canon(model, parsed) == _canon(model, model.model_validate(_emptied(body, model)))


def _emptied(body: dict[str, Any], model: type[pydantic.BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in body.items():
        ann = model.model_fields[name].annotation
        kind = _container(ann)
        if value is None and kind is not None:
            out[name] = kind()
        elif isinstance(value, list):
            out[name] = [[] if v is None else v for v in value]
        elif isinstance(value, dict) and kind is dict:
            inner = _container(typing.get_args(_split(ann)[0])[1])
            out[name] = {k: (inner() if v is None and inner else v) for k, v in value.items()}
        else:
            out[name] = value
    return out


# ---- the reference worker's own bodies ---------------------------------------------


def test_the_reference_registration_with_bare_devices_parses() -> None:
    """The body behind the captured 400 (interop/reference-worker-register-bare-devices)."""
    raw = (
        b'{"host":"box-a","boot_id":"92c6","recovery":{"survivors_checked":true,'
        b'"survivors_found":true},"devices":[{"name":"gpu0"},{"name":"gpu1"}],'
        b'"labels":{"":{"cpus":"2"},"gpu0":{},"gpu1":{}},'
        b'"declared_labels":{"gpu0":null,"gpu1":null},"sheet":"",'
        b'"device_sheets":{"gpu0":"","gpu1":""}}'
    )
    req = parse_model(raw, wire.RegisterRequest)
    assert req.declared_labels == {"gpu0": {}, "gpu1": {}}
    assert req.labels == {"": {"cpus": "2"}, "gpu0": {}, "gpu1": {}}


def test_top_level_null_facts_stay_not_sent() -> None:
    """API-032 / STORE-144: null labels mean "not sent", leaving stored facts alone."""
    req = parse_model(
        b'{"host":"h","devices":null,"labels":null,"declared_labels":null,'
        b'"sheet":null,"device_sheets":null}',
        wire.LabelsPush,
    )
    assert (req.devices, req.labels, req.declared_labels, req.sheet, req.device_sheets) == (
        [],
        None,
        None,
        None,
        None,
    )


def test_null_command_env_and_job_lists() -> None:
    sub = parse_model(b'{"command":null,"env":null,"submitter":"a"}', wire.SubmitRequest)
    assert not sub.command and not sub.env
    hb = parse_model(b'{"running_job_ids":null,"pending_job_ids":null}', wire.HeartbeatRequest)
    assert not hb.running_job_ids and not hb.pending_job_ids


@pytest.mark.parametrize(
    "raw",
    [
        b'{"priority": true}',  # a bool is never an int (API-001)
        b'{"priority": "1"}',
        b'{"command": "true"}',  # a string where a list belongs
        b'{"command": [null]}',  # null where a string belongs stays refused
        b'{"command": [1]}',
        b'{"env": {"A": null}}',
        b'{"env": {"A": 1}}',
        b'{"env": []}',
    ],
)
def test_strictness_is_kept(raw: bytes) -> None:
    with pytest.raises(errors.BadRequest):
        parse_model(raw, wire.SubmitRequest)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"host":"h","labels":{"gpu0":{"k":1}}}',
        b'{"host":"h","labels":{"gpu0":{"k":null}}}',
        b'{"host":"h","labels":{"gpu0":[]}}',
        b'{"host":"h","devices":[null]}',
        b'{"host":"h","devices":[{"name":"gpu0","max_runtime_seconds":false}]}',
        b'{"host":"h","device_sheets":{"gpu0":null}}',
    ],
)
def test_registration_strictness_is_kept(raw: bytes) -> None:
    with pytest.raises(errors.BadRequest):
        parse_model(raw, wire.RegisterRequest)
