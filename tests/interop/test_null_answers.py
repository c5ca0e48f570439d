"""The worker and the client read the reference controller's ``null`` lists and maps.

EXT-COMPAT-1, the other direction: the reference controller writes ``null`` for an
empty list or map in its answers (an assignment's ``env``, a poll's ``kills``, a job's
``env``, a state's ``queued``). Our worker and client read each as empty.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import pydantic
import pytest

from resource_controller import wire
from resource_controller.client import api, shapes, transport
from resource_controller.client.calls import Call
from resource_controller.worker.channel import parse_poll_body

# ---- the worker's poll parser --------------------------------------------------------


def test_poll_answer_with_null_env_and_kills() -> None:
    body = (
        b'{"assignments":[{"job_id":"x","device_id":"h:gpu0","command":["true"],"env":null}],'
        b'"kills":null}\n'
    )
    assignments, kills = parse_poll_body(body)
    assert kills == []
    [a] = assignments
    assert (a.job_id, a.device_id, a.command) == ("x", "h:gpu0", ["true"])
    assert not a.env


def test_poll_answer_with_every_list_null() -> None:
    assert parse_poll_body(b'{"assignments":null,"kills":["j1"]}') == ([], ["j1"])
    [a], kills = parse_poll_body(
        b'{"assignments":[{"job_id":"x","device_id":"h:gpu0","command":null,"env":null,'
        b'"cwd":null,"max_runtime_seconds":null,"submitter":null,"kind":null,"stdio":null,'
        b'"lease_epoch":null}],"kills":null}'
    )
    assert a.command == [] and not a.env and a.cwd is None and kills == []


def test_poll_answers_of_the_reference_capture_parse() -> None:
    """Every 200 poll answer the reference controller sent in the capture."""
    from interop.capture import session

    polls = [x for x in session() if "/assignments" in x["p"] and x["st"] == 200]
    assert polls
    for x in polls:
        assignments, kills = parse_poll_body(x["resp"].encode())
        assert assignments or kills


def test_poll_answer_still_refuses_a_wrong_shape() -> None:
    with pytest.raises(ValueError):
        parse_poll_body(b'{"assignments":[{"job_id":"x","device_id":"d","command":"true"}]}')
    with pytest.raises(ValueError):
        parse_poll_body(b'{"assignments":[],"kills":[null]}')


# ---- the client ----------------------------------------------------------------------


class Canned:
    """A transport that answers each path with a fixed JSON text."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers

    def request(self, call: Call) -> Any:
        request = f"{call.method} {call.path}"
        return call.answer(transport.decode(self.answers[call.path].encode(), request), request)

    def close(self) -> None:
        pass


JOB_WITH_NULLS = (
    '{"id":"j1","selector":"","kind":"job","command":["true"],"cwd":"","env":null,'
    '"submitter":"wc/sess","priority":0,"state":"running","device_id":"box-a:gpu0",'
    '"worker_id":"w","exit_code":null,"submitted_at":"2026-12-01T00:00:00Z"}'
)
DEVICE_VIEW_WITH_NULLS = (
    '{"device":{"id":"box-a:gpu0","host":"box-a","name":"gpu0","worker_id":"w",'
    '"state":"busy","last_heartbeat_at":"2026-12-01T00:00:00Z","labels":null},'
    '"job_id":"j1","command":null,"elapsed_seconds":1,"heartbeat_age_seconds":0}'
)


def client(answers: dict[str, str]) -> api.JsonClient:
    return api.JsonClient(http=Canned(answers), submitter="alice")  # type: ignore[arg-type]


def test_client_reads_null_lists_and_maps_as_empty() -> None:
    c = client(
        {
            "/v1/jobs": '{"jobs":null}',
            "/v1/jobs/j1": '{"job":' + JOB_WITH_NULLS + "}",
            "/v1/state": '{"devices":['
            + DEVICE_VIEW_WITH_NULLS
            + '],"jobs":['
            + JOB_WITH_NULLS
            + '],"queued":null,"queued_waiting_seconds":null}',
            "/v1/explain": '{"selector":"gpu","matching":null,"free":null,"queue_depth":0}',
            "/v1/devices/box-a:gpu0/describe": '{"device":{"id":"box-a:gpu0","host":"box-a",'
            '"name":"gpu0","worker_id":"w","state":"ready","last_heartbeat_at":"x",'
            '"labels":null},"elapsed_seconds":0,"heartbeat_age_seconds":0,"labels":null,'
            '"label_age_seconds":null,"sheet_updated_at":"x","recent_jobs":null}',
        }
    )
    assert c.jobs() == []
    job = c.get_job("j1").job
    assert job["command"] == ["true"] and "env" not in job and "exit_code" not in job
    state = c.state()
    assert state["queued"] == [] and "queued_waiting_seconds" not in state
    [view] = state["devices"]
    assert "command" not in view and "labels" not in view["device"]
    assert "env" not in state["jobs"][0]
    explain = c.explain("gpu")
    assert explain["matching"] == [] and explain["free"] == []
    describe = c.describe("box-a:gpu0")
    assert "labels" not in describe and "recent_jobs" not in describe
    assert "label_age_seconds" not in describe


def test_client_submit_answer_with_null_env() -> None:
    c = client({"/v1/jobs": JOB_WITH_NULLS})
    assert "env" not in c.submit(["true"], device="box-a:gpu0")


def test_a_required_list_sent_as_null_becomes_empty() -> None:
    job = shapes.normalise({"id": "j", "command": None, "env": {"A": "1"}}, shapes.JOB)
    assert job == {"id": "j", "command": [], "env": {"A": "1"}}


# ---- the client's shape table matches the response models ------------------------------


def _split(annotation: Any) -> tuple[Any, bool]:
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            arms = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = True
            annotation = arms[0]
        else:
            return annotation, optional


def _check(annotation: Any, shape: shapes.Shape | None, where: str) -> None:
    """Every list/map the model can hold, at any depth, has its place in ``shape``."""
    inner, _ = _split(annotation)
    origin = typing.get_origin(inner) or inner
    args = typing.get_args(inner)
    if origin is list:
        assert isinstance(shape, shapes.List), where
        _check(args[0], shape.item, where + "[]")
    elif origin is dict:
        assert isinstance(shape, shapes.Map), where
        _check(args[1], shape.value, where + "{}")
    elif isinstance(inner, type) and issubclass(inner, pydantic.BaseModel):
        holds = [n for n, f in inner.model_fields.items() if _holds_container(f.annotation)]
        if not holds:
            return
        assert isinstance(shape, shapes.Obj), where
        for name in holds:
            f = inner.model_fields[name]
            _check(f.annotation, shape.fields.get(name), f"{where}.{name}")
            top, optional = _split(f.annotation)
            if typing.get_origin(top) in (list, dict):
                # Always present in our answers -> [] / {}; omitted when empty -> dropped.
                assert (name in shape.keep) == (not optional), f"{where}.{name} keep"


def _holds_container(annotation: Any) -> bool:
    inner, _ = _split(annotation)
    origin = typing.get_origin(inner) or inner
    if origin in (list, dict):
        return True
    if isinstance(inner, type) and issubclass(inner, pydantic.BaseModel):
        return any(_holds_container(f.annotation) for f in inner.model_fields.values())
    return False


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (wire.JobBody, shapes.JOB),
        (wire.JobView, shapes.JOB_VIEW),
        (wire.JobList, shapes.JOB_LIST),
        (wire.DeviceBody, shapes.DEVICE),
        (wire.DeviceView, shapes.DEVICE_VIEW),
        (list[wire.DeviceView], shapes.DEVICE_VIEWS),
        (wire.State, shapes.STATE),
        (wire.Describe, shapes.DESCRIBE),
        (wire.Explain, shapes.EXPLAIN),
        (wire.RecoveryHistory, shapes.RECOVERY_HISTORY),
        (wire.UsageBody, shapes.USAGE),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_client_shapes_cover_every_list_and_map_of_the_answers(model: Any, shape: Any) -> None:
    _check(model, shape, getattr(model, "__name__", "answer"))


def test_normalise_is_the_identity_on_our_own_answers() -> None:
    """Our controller never sends null: normalising its answers changes nothing."""
    ours = json.loads('{"job":' + JOB_WITH_NULLS.replace(',"env":null', "") + "}")
    ours["job"].pop("exit_code")
    assert shapes.normalise(ours, shapes.JOB_VIEW) == ours
