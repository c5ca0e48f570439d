"""The client object: request bodies, error types and the polling budgets (CLI §3)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from client.fake_controller import FakeController, Reply
from resource_controller import errors
from resource_controller.client import api, transport, waits


def refused(*_: Any) -> errors.TransportError:
    return errors.TransportError("GET x: connection refused")


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def make(
    reply: Reply, clock: FakeTime | None = None
) -> tuple[api.JsonClient, FakeController, FakeTime]:
    """A client whose own transport reaches ``reply`` through its connection opener."""
    http = FakeController(reply)
    clock = clock or FakeTime()
    client = api.JsonClient(
        http=transport.Transport("http://ctl.test", "t", opener=http.open),
        submitter="alice@box",
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    return client, http, clock


# ---- CLI-072, CLI-074, CLI-075: submit and kill ------------------------------------------


def test_submit_body_omits_zero_values_and_sends_a_fresh_key() -> None:
    client, http, _ = make(lambda m, p, kw: {"id": "j1", "state": "queued"})
    client.submit(["python", "train.py"], device="box:gpu0")
    client.submit(["true"])
    first, second = (kw["body"] for _, _, kw in http.calls)
    assert set(first) == {"device_id", "command", "submitter", "idempotency_key"}
    assert first["command"] == ["python", "train.py"]
    assert first["submitter"] == "alice@box"
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
        first["idempotency_key"],
    )
    assert first["idempotency_key"] != second["idempotency_key"]
    assert "device_id" not in second and "selector" not in second  # any device (EXT-CLI-1)


def test_submit_body_carries_every_set_field() -> None:
    client, http, _ = make(lambda m, p, kw: {"id": "j1"})
    client.submit(
        ["a"],
        select="vram>=40G",
        cwd="/w",
        env={"A": "1"},
        priority=-3,
        max_runtime=90,
        idle_timeout=5.9,
        no_wait=True,
        stdio="tty",
    )
    body = http.calls[0][2]["body"]
    assert body["selector"] == "vram>=40G"
    assert body["env"] == {"A": "1"}
    assert (body["priority"], body["max_runtime_seconds"], body["idle_timeout_seconds"]) == (
        -3,
        90,
        5,
    )
    assert body["no_wait"] is True and body["stdio"] == "tty" and body["cwd"] == "/w"


def test_submit_409_is_no_device_whatever_the_body() -> None:
    client, _, _ = make(
        lambda m, p, kw: errors.ApiError("", "controller returned 409 Conflict", 409)
    )
    with pytest.raises(errors.NoDeviceError):
        client.submit(["true"], device="box:gpu0", no_wait=True)


def test_kill_sends_submitter_and_maps_409() -> None:
    client, http, _ = make(lambda m, p, kw: {})
    client.kill("j1")
    assert http.calls[0][:2] == ("POST", "/v1/jobs/j1/kill")
    assert http.calls[0][2]["body"] == {"submitter": "alice@box"}
    client, _, _ = make(lambda m, p, kw: errors.ApiError("not_cancellable", "", 409))
    with pytest.raises(errors.NotCancellableError, match="job not cancellable"):
        client.kill("j1")


def test_jobs_query_only_non_empty_filters() -> None:
    client, http, _ = make(lambda m, p, kw: {"jobs": []})
    client.jobs(state="queued", limit=0)
    assert http.calls[0][2]["query"] == {"state": "queued"}
    client.jobs(device="box:gpu0", limit=5, submitter="bob")
    assert http.calls[1][2]["query"] == {"device": "box:gpu0", "limit": "5", "submitter": "bob"}


def test_paths_keep_the_device_colon() -> None:
    client, http, _ = make(lambda m, p, kw: {"retired": "box:gpu0", "note": ""})
    client.describe("box:gpu0")
    client.device_action("box:gpu/0", "clear")
    client.device_action("box:gpu0", "")
    paths = [p for _, p, _ in http.calls]
    assert paths == [
        "/v1/devices/box:gpu0/describe",
        "/v1/devices/box:gpu%2F0/clear",
        "/v1/devices/box:gpu0",
    ]


def test_follow_logs_query() -> None:
    client, http, _ = make(lambda m, p, kw: iter(()))
    client.follow_logs("j")
    client.follow_logs("j", follow=False)
    client.follow_logs("j", follow=True, offset=12)
    assert [kw["query"] for _, _, kw in http.calls] == [
        None,
        {"follow": "false"},
        {"follow": "true", "offset": "12"},
    ]


# ---- CLI-077: wait-until-scheduled ----------------------------------------------------------


def view(state: str, position: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"job": {"id": "j", "state": state}}
    if position:
        out["queue_position"] = position
    return out


def test_scheduled_polls_until_the_job_leaves_the_queue() -> None:
    script = [view("queued", 3), view("queued", 3), view("queued", 2), view("queued", 1)]
    client, http, clock = make(lambda m, p, kw: script.pop(0) if script else view("assigned"))
    job = client.wait_until_scheduled("j")
    assert job["state"] == "assigned"
    assert all(kw["timeout"] == 1.0 for _, _, kw in http.calls)  # CLI-191
    assert clock.sleeps == [0.5] * 4  # CLI-190


def test_scheduled_returns_terminal_jobs_too() -> None:
    client, _, _ = make(lambda m, p, kw: view("killed"))
    assert client.wait_until_scheduled("j")["state"] == "killed"


def test_scheduled_gives_up_on_the_17th_consecutive_failure() -> None:
    client, http, _ = make(refused)
    with pytest.raises(waits.PollGiveUp, match=r"job j after 17"):
        client.wait_until_scheduled("j")
    assert len(http.calls) == 17


def test_scheduled_failures_reset_on_success() -> None:
    script: list[Any] = [*[refused()] * 16, view("queued", 1), *[refused()] * 16, view("running")]
    client, http, _ = make(lambda m, p, kw: script.pop(0))
    assert client.wait_until_scheduled("j")["state"] == "running"
    assert len(http.calls) == 34


def test_scheduled_non_2xx_counts_as_failure() -> None:
    client, http, _ = make(lambda m, p, kw: errors.ApiError("store_error", "db", 500))
    with pytest.raises(waits.PollGiveUp):
        client.wait_until_scheduled("j")
    assert len(http.calls) == 17


def test_scheduled_deadline_is_a_timeout_not_a_give_up() -> None:
    client, http, clock = make(lambda m, p, kw: view("queued", 1))
    with pytest.raises(waits.WaitTimeout, match="deadline exceeded"):
        client.wait_until_scheduled("j", deadline=1.2)
    assert clock.now == pytest.approx(1.2)
    assert http.calls[-1][2]["timeout"] <= 1.0


# ---- CLI-078: wait-until-terminal -------------------------------------------------------------


def test_terminal_returns_once_terminal() -> None:
    script = [view("running"), view("running"), view("failed")]
    client, http, _ = make(lambda m, p, kw: script.pop(0))
    assert client.wait_until_terminal("j")["state"] == "failed"
    assert all(kw["timeout"] == 10.0 for _, _, kw in http.calls)  # CLI-192


def test_terminal_gives_up_on_the_6th_failure_naming_last_state() -> None:
    script: list[Any] = [view("running"), *[refused()] * 6]
    client, http, _ = make(lambda m, p, kw: script.pop(0))
    with pytest.raises(waits.PollGiveUp, match=r"job j.*last known state: running"):
        client.wait_until_terminal("j")
    assert len(http.calls) == 7


def test_terminal_unknown_state_when_never_seen() -> None:
    client, _, _ = make(refused)
    with pytest.raises(waits.PollGiveUp, match="last known state: unknown"):
        client.wait_until_terminal("j")


def test_terminal_overall_bound_names_bound_job_and_state() -> None:
    client, _, clock = make(lambda m, p, kw: view("assigned"))
    with pytest.raises(
        waits.WaitTimeout, match=r"job j did not finish within 5m0s \(last known state: assigned\)"
    ):
        client.wait_until_terminal("j", bound=300)
    assert clock.now == pytest.approx(300)


# ---- EXT-CLI-5: resuming a broken stream ------------------------------------------------------


def broken(chunks: list[bytes], breaks: bool) -> Iterator[bytes]:
    """A stream that yields its chunks, then breaks (or ends)."""
    yield from chunks
    if breaks:
        raise errors.TransportError("GET logs: reset")


def test_output_resumes_at_the_offset_reached() -> None:
    streams = [broken([b"abc", b"de"], True), broken([b"fg"], False)]
    client, http, _ = make(lambda m, p, kw: streams.pop(0))
    assert b"".join(client.output("j")) == b"abcdefg"
    assert [kw["query"] for _, _, kw in http.calls] == [None, {"offset": "5"}]


def test_output_refusal_is_final() -> None:
    def reply(m: str, p: str, kw: dict[str, Any]) -> Any:
        raise errors.ApiError("logs_not_stored", "attached", 400)

    client, http, _ = make(reply)
    with pytest.raises(errors.ApiError):
        list(client.output("j"))
    assert len(http.calls) == 1


def test_output_waits_out_an_outage_then_says_it_lost_contact() -> None:
    def reply(m: str, p: str, kw: dict[str, Any]) -> Any:
        raise errors.TransportError("refused")

    client, http, clock = make(reply)
    with pytest.raises(waits.LostContact) as info:
        list(client.output("j"))
    assert clock.now >= waits.QUIET and info.value.job_id == "j"
    assert len(http.calls) == pytest.approx(waits.QUIET / waits.POLL_INTERVAL, abs=2)


# ---- EXT-PYAPI-1: configuration from the environment ------------------------------------------


def test_client_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RC_CONTROLLER", "http://ctl.example:9/")
    monkeypatch.setenv("RC_TOKEN", "tok")
    monkeypatch.setenv("RC_SUBMITTER", "  me ")
    client = api.JsonClient()
    assert client._http.base_url == "http://ctl.example:9"
    assert client.submitter == "me"
