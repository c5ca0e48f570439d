"""``rc hold`` (CLI §5): its checks before any request, then against a real controller."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import Result

from cli.conftest import Rc, Spawn
from client.live import ADMIN, CLIENT, WORKER, FakeWorker, LiveController, until_killed
from client.steps import Steps
from resource_controller import errors
from resource_controller.cli import hold as hold_cli
from resource_controller.cli import signals
from resource_controller.client import api, submit
from resource_controller.core import durations

#: CLI-123 [format]; the expiry in UTC ``Z``, or local with its offset before ``started_at``.
GRANTED = re.compile(
    r"rc: hold (\S+) granted on (\S+), expires around"
    r" (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d))"
)


def check_expiry(printed: str, job: dict[str, Any], ttl: int) -> None:
    """``started_at + ttl`` exactly when printed in UTC; else local now + ttl, near it."""
    expected = datetime.fromisoformat(job["started_at"]) + timedelta(seconds=ttl)
    if printed.endswith("Z"):
        assert printed == expected.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    else:
        assert abs((datetime.fromisoformat(printed) - expected).total_seconds()) < 3


# ---- CLI-120: checks in order, nothing requested before a failing one -------------------------


@pytest.fixture
def dead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller address that refuses: any request shows up as 'connection refused'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("RC_CONTROLLER", url)
    monkeypatch.setenv("RC_TOKEN", CLIENT)


def refused(result: Result) -> bool:
    return "connection refused" in result.stderr


def one_error(result: Result) -> str:
    """Exit 1 with exactly one ``rc:`` line on stderr, no usage text, nothing requested."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr
    assert err.startswith("rc: ") and err.count("\n") == 1, err
    assert result.stdout == "" and "Usage:" not in err  # CLI-003
    assert not refused(result), err
    return err


@pytest.mark.usefixtures("dead")
def test_more_than_one_positional_comes_first(run_rc: Rc) -> None:
    err = one_error(run_rc("hold", "box:gpu0", "box:gpu1", "--select", "a=b"))
    assert "one device" in err


@pytest.mark.usefixtures("dead")
def test_device_and_select_name_both(run_rc: Rc) -> None:
    # Before the reason and TTL checks: neither is given here.
    err = one_error(run_rc("hold", "box:gpu0", "--select", "a=b"))
    assert "DEVICE" in err and "--select" in err


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize("reason", [None, "", "   ", "\t\n"])
def test_reason_is_required(run_rc: Rc, reason: str | None) -> None:
    args = ["hold", "box:gpu0", "--ttl", "30m"]
    if reason is not None:
        args += ["--reason", reason]
    err = one_error(run_rc(*args))
    assert "--reason" in err and "required" in err


@pytest.mark.usefixtures("dead")
def test_reason_is_checked_before_ttl(run_rc: Rc) -> None:
    err = one_error(run_rc("hold", "box:gpu0"))
    assert "--reason" in err and "--ttl" not in err


@pytest.mark.usefixtures("dead")
def test_ttl_is_required(run_rc: Rc) -> None:
    err = one_error(run_rc("hold", "box:gpu0", "--reason", "profiling"))
    assert "--ttl is required" in err


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize("ttl", ["0", "-0s", "0s", "0h0m"])
def test_a_zero_ttl_says_what_is_wrong_with_it(run_rc: Rc, ttl: str) -> None:
    err = one_error(run_rc("hold", "box:gpu0", "--reason", "profiling", f"--ttl={ttl}"))
    assert "required" not in err
    assert err.startswith("rc: --ttl must be in 1s..596523h14m7s, got 0"), err


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize("ttl", ["999999h", "596523h14m8s"])
def test_a_ttl_over_the_limit_names_the_flag_and_the_limit(run_rc: Rc, ttl: str) -> None:
    err = one_error(run_rc("hold", "box:gpu0", "--reason", "x", "--ttl", ttl))  # EXT-LIMITS-1
    assert err == "rc: --ttl must be at most 596523h14m7s (2147483647 seconds, about 68 years)\n"
    assert "max_runtime" not in err


@pytest.mark.usefixtures("dead")
def test_the_longest_ttl_reaches_the_submit(run_rc: Rc) -> None:
    result = run_rc("hold", "box:gpu0", "--reason", "x", "--ttl", "596523h14m7s")
    assert result.exit_code == 1 and refused(result), result.stderr


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize("args", [["--ttl", "-5m"], ["--ttl=-5m"], ["--ttl=-1h30m"]])
def test_negative_ttl_is_a_usage_error_naming_the_flag(run_rc: Rc, args: list[str]) -> None:
    err = one_error(run_rc("hold", "box:gpu0", "--reason", "x", *args))  # EXT-CLI-8
    assert "--ttl" in err and "negative" in err and "0 means none" not in err


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize("ttl", ["2d", "10", "abc", ""])
def test_malformed_ttl_names_the_flag(run_rc: Rc, ttl: str) -> None:
    err = one_error(run_rc("hold", "box:gpu0", "--reason", "x", "--ttl", ttl))
    assert "--ttl" in err


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize("ttl", ["500ms", "0.9s"])
def test_sub_second_ttl_is_refused(run_rc: Rc, ttl: str) -> None:
    err = one_error(run_rc("hold", "box:gpu0", "--reason", "x", "--ttl", ttl))  # CLI-073
    assert "--ttl" in err and "second" in err


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize(
    "args",
    [
        ["box:gpu0"],
        ["--select", "a=b"],
        [],  # EXT-CLI-1: neither takes any device
        ["--as", "someone", "box:gpu0"],
    ],
)
def test_valid_holds_reach_the_submit(run_rc: Rc, args: list[str]) -> None:
    result = run_rc("hold", *args, "--ttl", "1s", "--reason", "profiling")
    assert result.exit_code == 1 and refused(result), result.stderr
    assert "POST" in result.stderr and "/v1/jobs" in result.stderr


@pytest.mark.usefixtures("dead")
@pytest.mark.parametrize("args", [["hold", "--help"], ["hold", "-h"], ["help", "hold"]])
def test_help(run_rc: Rc, args: list[str]) -> None:
    result = run_rc(*args)
    assert result.exit_code == 0 and result.stderr == ""
    out = result.stdout
    assert "Usage: rc hold" in out and "[DEVICE]" in out
    for word in ("--select", "--ttl", "--reason", "--as", "Ctrl-C", "rc release", "130"):
        assert word in out, word


@pytest.mark.usefixtures("dead")
def test_hold_is_listed(run_rc: Rc) -> None:
    assert "  hold " in run_rc("--help").stdout


# ---- CLI-123: the expiry ---------------------------------------------------------------------


def test_expiry_is_started_at_plus_ttl_in_utc() -> None:
    job = {"started_at": "2026-08-13T14:30:00.4+02:00"}
    assert hold_cli.expires_around(job, 1800) == "2026-08-13T13:00:00Z"


def test_expiry_without_started_at_is_local_now_with_its_offset() -> None:
    now = datetime(2026, 8, 13, 12, 0, 0, tzinfo=timezone(timedelta(hours=2)))
    assert hold_cli.expires_around({}, 90, now=now) == "2026-08-13T12:01:30+02:00"


# ---- against a real controller -----------------------------------------------------------------


def play_hold(worker: FakeWorker, assignment: dict[str, Any]) -> tuple[str, int | None, str]:
    """What a worker does with a hold: sleep until killed or until the TTL (WRK-125)."""
    ttl = assignment.get("max_runtime_seconds") or 0
    if worker.killed(assignment["job_id"]).wait(ttl):
        return ("killed", 143, "cancelled")
    return ("killed", 137, f"max_runtime exceeded ({durations.render_duration(ttl)})")


@pytest.fixture
def env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "tester"}


@pytest.fixture
def client(controller: LiveController) -> api.JsonClient:
    return api.JsonClient(controller.url, CLIENT, submitter="tester")


def wait_for(predicate: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def active_hold(client: api.JsonClient) -> api.Json | None:
    jobs = [j for j in client.state()["jobs"] if j.get("kind") == "hold"]
    return jobs[0] if jobs and jobs[0].get("state") == "running" else None


def test_granted_then_released_elsewhere_exits_0(
    spawn_rc: Spawn, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    worker.behaviour = play_hold
    background = spawn_rc(
        "hold", "box:gpu1", "--ttl", "10m30.9s", "--reason", "manual profiling", env=env
    )
    hold = wait_for(lambda: active_hold(client))
    other = api.JsonClient(client._http.base_url, CLIENT, submitter="tester")
    other.kill(hold["id"])  # rc release from another terminal
    result = background.result(15)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 3, lines
    m = GRANTED.fullmatch(lines[0])
    assert m and m.group(1) == hold["id"] and m.group(2) == "box:gpu1", lines[0]
    job = client.get_job(hold["id"]).job
    check_expiry(m.group(3), job, 630)
    assert f"rc release {hold['id']}" in lines[1] and "Ctrl-C" in lines[1]
    assert hold["id"] in lines[2] and job["kill_reason"] in lines[2]  # CLI-124
    # CLI-121 and EXT-CLI-4: what went on the wire.
    assert job["kind"] == "hold" and job["reason"] == "manual profiling"
    assert job["max_runtime_seconds"] == 630 and job["command"] == ["hold"]
    assert job["submitter"] == "tester" and job.get("idempotency_key")
    assert not job.get("cwd") and not job.get("env") and not job.get("idle_timeout_seconds")
    assert job["state"] == "killed"


def test_ttl_expiry_exits_0_with_the_reason(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker
) -> None:
    worker.behaviour = play_hold
    start = time.monotonic()
    result = run_rc("hold", "--ttl", "1s", "--reason", "quick look", env=env)  # any device
    assert time.monotonic() - start >= 1
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    m = GRANTED.fullmatch(lines[0])
    assert m and m.group(2) in ("box:gpu0", "box:gpu1"), lines
    assert len(lines) == 3 and m.group(1) in lines[2]
    assert "max_runtime exceeded (1s)" in lines[2]


def test_queued_hold_is_granted_when_the_device_frees(
    spawn_rc: Spawn, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    blocker = client.submit(["block"], device="box:gpu0")
    worker.behaviour = until_killed
    wait_for(lambda: client.get_job(blocker["id"]).state == "running")
    background = spawn_rc("hold", "box:gpu0", "--ttl", "1s", "--reason", "r", env=env)
    background.said("queued at position 1")
    worker.behaviour = play_hold
    client.kill(blocker["id"])
    result = background.result(15)
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    # CLI-122 = CLI-106, with what it waits for appended (EXT-WHY-2)
    assert lines[0].startswith("rc: queued at position 1 for box:gpu0 — held by tester (job ")
    # A poll may land between the blocker's release and the pass that places the hold:
    # what it waits for changed, so the line comes again (EXT-WHY-2) before the grant.
    granted = next(i for i, line in enumerate(lines) if GRANTED.fullmatch(line))
    assert all(line.startswith("rc: queued at position 1 ") for line in lines[:granted])
    assert "max_runtime exceeded" in lines[-1]


def test_hold_killed_while_queued_was_never_granted(
    spawn_rc: Spawn, env: dict[str, str], worker: FakeWorker, client: api.JsonClient
) -> None:
    worker.behaviour = until_killed
    blocker = client.submit(["block"], device="box:gpu0")
    wait_for(lambda: client.get_job(blocker["id"]).state == "running")
    background = spawn_rc("hold", "box:gpu0", "--ttl", "1m", "--reason", "r", env=env)
    queued = wait_for(lambda: client.state()["queued"])
    admin = api.JsonClient(client._http.base_url, ADMIN, submitter="root")
    admin.kill(queued[0]["id"])
    result = background.result(10)
    assert result.exit_code == 1
    last = result.stderr.splitlines()[-1]
    assert queued[0]["id"] in last and "never granted" in last and "killed" in last
    assert "box:gpu0" in last and "admin override" in last
    client.kill(blocker["id"])


def test_ttl_above_the_ceiling_is_refused_never_shortened(
    run_rc: Rc, env: dict[str, str], controller: LiveController
) -> None:
    http = controller.http(WORKER)
    try:
        body = {"host": "capped", "devices": [{"name": "gpu0", "max_runtime_seconds": 60}]}
        http.request("POST", "/v1/workers/register", body=body)
    finally:
        http.close()
    result = run_rc("hold", "capped:gpu0", "--ttl", "61s", "--reason", "r", env=env)
    assert result.exit_code == 1
    assert (
        result.stderr.startswith("rc: runtime_above_ceiling: ") and result.stderr.count("\n") == 1
    )


def test_as_under_a_named_token_says_it_is_replaced(
    run_rc: Rc,
    env: dict[str, str],
    worker: FakeWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # EXT-WHO-4, as rc run does: the name the token owns replaces --as.
    monkeypatch.setattr(
        api.JsonClient, "whoami", lambda self, **kw: {"role": "client", "name": "al"}
    )
    worker.behaviour = play_hold
    result = run_rc("hold", "--as", "bob", "--ttl", "1s", "--reason", "r", env=env)
    assert result.exit_code == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert "--as 'bob' is recorded as 'al'" in first


# ---- the state machine's other paths, with no I/O (``client/steps.py``) -----------------------


GRANTED_JOB = {"id": "h1", "state": "assigned", "device_id": "box:gpu0"}
QUEUED_JOB = {"id": "h1", "state": "queued"}


def held(submitted: Any, views: list[Any], kill: Any = None) -> tuple[Any, Steps]:
    """``rc hold box:gpu0 --ttl 1m``'s machine, the controller answering from the lists."""

    def reply(step: Any) -> Any:
        if step.method == "POST" and step.path == "/v1/jobs":
            return submitted
        if step.path.endswith("/kill"):
            return kill
        answer = views.pop(0) if len(views) > 1 else views[0]
        return answer if isinstance(answer, BaseException) else {"job": answer}

    steps = Steps(reply)
    wanted = submit.hold(60, "r", hold_cli.NAMES, device="box:gpu0")
    return steps.run(hold_cli.held(wanted, "me", steps.clock)), steps


def kills(steps: Steps) -> list[Any]:
    return [c.timeout for c in steps.requests("POST", "/v1/jobs/h1/kill")]


def test_interrupt_while_granted_releases_within_the_bound() -> None:
    done, steps = held(GRANTED_JOB, [signals.Interrupted(2)], kill={})
    assert done.code == 130  # CLI-126
    assert kills(steps) == [10.0]  # CLI-057
    assert steps.notes[-1] == "released hold h1"


@pytest.mark.parametrize(
    "error",
    [errors.TransportError("POST /v1/jobs/h1/kill: timed out"), errors.NotCancellableError("done")],
)
def test_a_failed_release_still_exits_130(error: errors.ClientError) -> None:
    done, steps = held(GRANTED_JOB, [signals.Interrupted(15)], kill=error)
    assert done.code == 130
    assert "could not release hold h1" in steps.notes[-1] and str(error) in steps.notes[-1]


def test_interrupt_while_queued_cancels() -> None:
    done, steps = held(QUEUED_JOB, [signals.Interrupted(2), {"id": "h1", "state": "killed"}], {})
    assert done.code == 130  # CLI-122: CANCEL exactly as CLI-109
    [timeout] = kills(steps)
    assert timeout == pytest.approx(10.0, abs=0.5)
    assert steps.notes == ["cancelled queued job h1"]


def test_interrupt_during_the_submit_is_an_ordinary_failure() -> None:
    with pytest.raises(signals.Interrupted):
        held(signals.Interrupted(2), [GRANTED_JOB])


def test_a_lost_controller_while_granted_fails_and_does_not_release() -> None:
    done, steps = held(GRANTED_JOB, [errors.TransportError("refused")])
    assert done.code == 1 and "h1" in done.message and "TTL" in done.message  # CLI-125
    assert kills(steps) == [] and steps.now >= 300  # an outage is waited out first


def test_a_lost_controller_while_queued_loses_track_and_leaves_the_hold() -> None:
    done, steps = held(QUEUED_JOB, [errors.TransportError("refused")])
    assert done.code == 75  # CLI-122, and contact lost
    assert "lost track of hold h1" in done.message and "granted" in done.message
    assert "rc ps" in done.message and kills(steps) == []


def test_already_terminal_after_the_queue() -> None:
    ended = {"id": "h1", "state": "killed", "started_at": "2026-08-13T12:00:00Z"}
    done, _ = held(QUEUED_JOB, [{**ended, "kill_reason": "worker lost"}])
    assert done.code == 1 and "h1" in done.message and "already killed" in done.message
