"""``rc run``'s state machine with no I/O at all (CLI-104..114, CLI-193), and how it waits
out the faults a client must survive: a controller that stops answering, a database
outage under a submit or a running job, a poll that moved to another controller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from client.steps import Steps, Stream
from resource_controller import errors
from resource_controller.cli import signals
from resource_controller.client import calls, machine
from resource_controller.client.submit import Submit

JOB = "/v1/jobs/j1"
QUEUED = {"id": "j1", "state": "queued"}
RUNNING = {"id": "j1", "state": "running", "device_id": "box:gpu0", "started_at": "t"}


def ended(code: int | None, state: str = "failed", reason: str = "") -> dict[str, Any]:
    job: dict[str, Any] = {**RUNNING, "state": state, "kill_reason": reason}
    if code is not None:
        job["exit_code"] = code
    return job


def view(job: dict[str, Any], position: int = 0) -> dict[str, Any]:
    return {"job": job, "queue_position": position}


def store_error() -> errors.ApiError:
    return errors.api_error("store_error", "database unavailable", 500)


class Controller:
    """Answers by route: ``submits`` and ``views`` are consumed in order (the last one
    repeats), ``streams`` are the follows opened, ``kills`` what a kill answers."""

    def __init__(
        self,
        submits: list[Any],
        views: list[Any],
        streams: list[Any] | None = None,
        kills: Any = None,
    ) -> None:
        self.submits = submits
        self.views = views
        self.streams = streams if streams is not None else [Stream([b""])]
        self.kills = kills

    @staticmethod
    def _next(answers: list[Any]) -> Any:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return answer() if callable(answer) else answer

    def __call__(self, step: Any) -> Any:
        if isinstance(step, calls.Open):
            return self._next(self.streams)
        if step.path == "/v1/jobs" and step.method == "POST":
            return self._next(self.submits)
        if step.path.endswith("/kill"):
            return self.kills
        return self._next(self.views)


def run(ctl: Callable[[Any], Any], spec: Submit | None = None, timeout: float = 0) -> Any:
    steps = Steps(ctl)
    out: list[bytes] = []
    wanted = spec or Submit(["train"], device="box:gpu0")
    ran = steps.run(machine.run(wanted, "me", steps.clock, timeout=timeout, sink=out.append))
    steps.out = out
    return ran, steps


# ---- SUBMIT (CLI-104, CLI-105), and a submit through an outage --------------------------------


def test_a_busy_refusal_is_raised_for_the_front_end_to_say() -> None:
    refused = errors.ApiError("", "controller returned 409 Conflict", 409)
    with pytest.raises(errors.NoDeviceError):
        run(Controller([refused], []))


def test_a_submit_the_database_cannot_take_is_tried_again_with_the_same_key() -> None:
    ctl = Controller([store_error(), store_error(), RUNNING], [view(ended(3))])
    ran, steps = run(ctl)
    assert (ran.code, ran.kind) == (3, "ended")  # the job's real code
    bodies = [c.body for c in steps.requests("POST", "/v1/jobs")]
    assert len(bodies) == 3 and len({b["idempotency_key"] for b in bodies}) == 1
    said = [n for n in steps.notes if "trying again" in n]
    assert len(said) == 1 and "store_error" in said[0] and "30s" in said[0]  # once


def test_a_submit_nobody_answers_is_tried_again_within_its_bound_then_fails() -> None:
    steps = Steps(Controller([Steps.NO_ANSWER], []))
    with pytest.raises(errors.TimedOut):
        steps.run(machine.run(Submit(["x"]), "me", steps.clock))
    assert len(steps.requests("POST", "/v1/jobs")) > 1
    assert machine.SUBMIT_WAIT <= steps.now < machine.SUBMIT_WAIT + 10


@pytest.mark.parametrize(
    "error",
    [
        errors.api_error("runtime_above_ceiling", "over", 400),
        errors.ConnectFailed("POST /v1/jobs: connection refused (controller x from RC_CONTROLLER)"),
    ],
)
def test_a_refusal_or_a_controller_nobody_can_reach_fails_at_once(error: Exception) -> None:
    ctl = Controller([error], [])
    steps = Steps(ctl)
    with pytest.raises(type(error)):
        steps.run(machine.run(Submit(["x"]), "me", steps.clock))
    assert len(steps.requests("POST")) == 1 and steps.now == 0


# ---- WAIT_QUEUE (CLI-106..109) -----------------------------------------------------------------


def test_the_queue_wait_says_each_position_then_runs_and_exits_with_the_code() -> None:
    views = [
        view(QUEUED, 2),
        view(QUEUED, 2),
        view(QUEUED, 1),
        view(RUNNING),
        view(ended(0, "succeeded")),
    ]
    ran, steps = run(Controller([QUEUED], views, [Stream([b"out\n", b""])]))
    assert (ran.code, ran.message) == (0, "")
    assert steps.notes == [
        "queued at position 2 for box:gpu0",
        "queued at position 1 for box:gpu0",
        "job j1 on box:gpu0",
    ]
    assert steps.out == [b"out\n"]


def test_my_own_timeout_cancels_the_queued_job() -> None:
    ctl = Controller([QUEUED], [view(QUEUED, 1)], kills={})
    ran, steps = run(ctl, timeout=3)
    assert (ran.code, ran.kind) == (1, "gave_up")
    assert ran.message == "gave up waiting for box:gpu0 (deadline exceeded)"
    assert len(steps.requests("POST", JOB + "/kill")) == 1
    assert steps.notes[-1] == "cancelled queued job j1"  # CLI-109 [format]


def test_an_outage_while_queued_is_waited_out() -> None:
    views: list[Any] = [view(QUEUED, 1), *[errors.TransportError("reset")] * 40]
    views += [view(RUNNING), view(ended(0, "succeeded"))]
    ran, steps = run(Controller([QUEUED], views))
    assert (ran.code, ran.kind) == (0, "ended")  # 40 failed polls: far more than 17
    assert steps.requests("POST", JOB + "/kill") == []


def test_a_queue_wait_that_hears_nothing_for_its_bound_loses_contact_and_kills_nothing() -> None:
    ran, steps = run(Controller([QUEUED], [view(QUEUED, 1), Steps.NO_ANSWER]))
    assert (ran.code, ran.kind) == (machine.EXIT_LOST, "lost")
    assert ran.message.startswith("lost track of job j1 while it was queued")
    assert "rc ps" in ran.message and steps.requests("POST", JOB + "/kill") == []
    assert steps.now >= machine.FINAL_WAIT


@pytest.mark.parametrize(
    ("kill", "refetched", "said"),
    [
        ({}, ended(None, "killed"), "cancelled queued job j1"),
        ({}, RUNNING, "started on box:gpu0 just as it was being cancelled"),
        (errors.NotCancellableError("done"), RUNNING, "it is STILL RUNNING on box:gpu0"),
        (errors.NotCancellableError("done"), ended(0, "succeeded"), "finished before it could"),
        (errors.TransportError("reset"), None, "could not cancel queued job j1: reset"),
    ],
)
def test_an_interrupt_while_queued_cancels_and_says_what_became_of_the_job(
    kill: Any, refetched: Any, said: str
) -> None:
    views = [view(QUEUED, 1), signals.Interrupted(2), view(refetched or RUNNING)]
    ran, steps = run(Controller([QUEUED], views, kills=kill))
    assert (ran.code, ran.kind) == (130, "interrupted")  # the trigger's code (CLI-109)
    assert isinstance(ran.interrupt, signals.Interrupted)
    assert said in steps.notes[-1]


def test_a_job_that_left_the_queue_without_starting_fails_saying_so() -> None:
    killed = {"id": "j1", "state": "killed", "kill_reason": "killed by bob"}
    ran, steps = run(Controller([QUEUED], [view(killed)]))
    assert (ran.code, ran.kind) == (1, "never_started")  # CLI-108
    assert ran.message == "job j1 killed, never started on box:gpu0: killed by bob"
    assert steps.opened() == []


def test_a_count_the_controller_ignored_kills_the_job() -> None:
    ctl = Controller([RUNNING], [view(RUNNING)], kills={})
    ran, steps = run(ctl, Submit(["x"], count=2))
    assert (ran.code, ran.kind) == (1, "count") and "does not support count" in ran.message
    assert len(steps.requests("POST", JOB + "/kill")) == 1


# ---- STREAM and WAIT_TERMINAL (CLI-110..112), through faults ------------------------------------


def test_a_broken_stream_resumes_and_the_run_ends_with_the_jobs_code() -> None:
    reset = errors.Disconnected("GET logs: reset")
    streams = [Stream([b"epoch 1\n", reset]), Stream([b"epoch 2\n", b""])]
    ran, steps = run(Controller([RUNNING], [view(ended(3, reason="exit 3"))], streams))
    assert steps.out == [b"epoch 1\n", b"epoch 2\n"]
    assert (ran.code, ran.message) == (3, "job j1: exit 3")  # CLI-114 (1)


def test_a_frozen_controller_is_left_invisibly_for_the_one_that_answers() -> None:
    # Its follow goes silent; the poll meanwhile gets no answer there and moves to b
    # (the transport's fail-over), so the follow is reopened on b at its offset.
    streams = [Stream([b"abc", None], base="http://a"), Stream([b"de", b""], base="http://b")]

    def moved() -> Any:
        steps.where = "http://b"
        return view(ended(0, "succeeded"))

    steps = Steps(Controller([RUNNING], [moved], streams))
    out: list[bytes] = []
    ran = steps.run(machine.run(Submit(["x"]), "me", steps.clock, sink=out.append))
    assert b"".join(out) == b"abcde" and ran.code == 0
    assert [o.query for o in steps.opened()] == [None, {"offset": "3"}]
    assert steps.notes == ["job j1 on box:gpu0"]  # no error shown, no note either


def test_a_refused_stream_is_said_and_the_job_is_still_waited_for() -> None:
    refused = errors.api_error("logs_not_stored", "attached job", 400)
    ran, steps = run(Controller([RUNNING], [view(ended(0, "succeeded"))], [refused]))
    assert ran.code == 0
    assert steps.notes[-1] == "log stream ended: logs_not_stored: attached job"  # CLI-111


def test_a_database_outage_in_the_final_wait_is_waited_out_to_the_jobs_real_code() -> None:
    # Six failed polls used to give up with exit 1, though the job succeeded with 9 later.
    views: list[Any] = [store_error] * 30 + [view(ended(9))]
    ran, steps = run(Controller([RUNNING], views))
    assert (ran.code, ran.kind) == (9, "ended")
    assert not any("gave up" in n for n in steps.notes)


def test_hearing_nothing_for_the_final_bound_is_lost_contact_naming_where_the_result_is() -> None:
    ran, steps = run(Controller([RUNNING], [Steps.NO_ANSWER]))
    assert (ran.code, ran.kind) == (machine.EXIT_LOST, "lost")
    assert ran.code not in (0, 1, 130)  # no other outcome of rc's uses it
    assert "lost contact with job j1" in ran.message
    assert "rc jobs" in ran.message and "rc logs j1" in ran.message
    assert steps.requests("POST", JOB + "/kill") == []
    assert machine.FINAL_WAIT <= steps.now < machine.FINAL_WAIT + 30


def test_a_job_that_stays_unfinished_for_the_final_bound_is_not_called_failed() -> None:
    streams = [errors.api_error("logs_not_stored", "x", 400)]
    ran, _ = run(Controller([RUNNING], [view({**RUNNING, "state": "assigned"})], streams))
    assert (ran.code, ran.kind) == (machine.EXIT_LOST, "lost")
    assert "did not finish within 5m0s (last known state: assigned)" in ran.message


@pytest.mark.parametrize(
    ("job", "code", "message"),
    [
        (ended(0, "succeeded"), 0, ""),
        (ended(None, "succeeded"), 0, ""),
        (ended(-1, reason="start failed"), 255, "job j1: start failed"),
        (ended(512), 1, ""),
        (ended(0, "killed", "cancelled"), 1, "job j1 killed: cancelled"),
        (ended(None, "lost"), 1, "job j1 lost: no further detail"),
    ],
)
def test_the_exit_of_an_ended_job(job: dict[str, Any], code: int, message: str) -> None:
    out = machine.ended(job)  # CLI-114
    assert (out.code, out.message) == (code, message)


# ---- DETACH (CLI-113) and RELAY -------------------------------------------------------------------


def test_an_interrupt_while_streaming_detaches_and_leaves_the_job_running() -> None:
    streams = [Stream([b"a", signals.Interrupted(2)])]
    ran, steps = run(Controller([RUNNING], [view(RUNNING)], streams))
    assert (ran.code, ran.kind) == (130, "detached")
    assert "STILL RUNNING on box:gpu0" in steps.notes[-1] and "rc ps" in steps.notes[-1]
    assert steps.requests("POST", JOB + "/kill") == []


def test_an_interrupt_after_the_job_ended_gives_its_own_code() -> None:
    streams = [Stream([KeyboardInterrupt()])]
    ran, steps = run(Controller([RUNNING], [view(ended(4))], streams))
    assert ran.code == 4 and isinstance(ran.interrupt, KeyboardInterrupt)
    assert steps.notes[-1] == "job j1 had already ended (failed)"


def test_a_relayed_job_is_joined_then_waited_for() -> None:
    ran, steps = run(
        Controller([RUNNING], [view(ended(0, "succeeded"))]), Submit(["sh"], stdio="tty")
    )
    assert ran.code == 0 and steps.relayed == [("j1", "tty")] and steps.opened() == []


def test_an_output_that_cannot_be_written_ends_the_stream_not_the_wait() -> None:
    def full(chunk: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    steps = Steps(Controller([RUNNING], [view(ended(2))], [Stream([b"x", b""])]))
    ran = steps.run(machine.run(Submit(["x"]), "me", steps.clock, sink=full))
    assert ran.code == 2 and steps.notes[-1].startswith("log stream ended: cannot write output")


def test_a_victim_s_run_names_each_preemption_once_and_not_a_requeue_that_never_came() -> None:
    # EXT-PREEMPT-2: while it stops the job names its preemptor; after the next attempt
    # the attempts list does; a --no-requeue victim that ended queues no more.
    from resource_controller.client.machine import PreemptReport

    report = PreemptReport()
    stopping = {"id": "j1", "state": "running", "attempt": 1, "preempted_by": "k"}
    assert report.lines(stopping) == [
        "job j1: attempt 1 preempted by job k; queued again for attempt 2"
    ]
    done = {
        "id": "j1",
        "state": "succeeded",
        "attempt": 2,
        "attempts": [{"attempt": 1, "state": "preempted", "kill_reason": "preempted by k"}],
    }
    assert report.lines(done) == []  # said once
    stopped = {"id": "j2", "state": "killed", "attempt": 1, "preempted_by": "k"}
    assert PreemptReport().lines(stopped) == []
