"""The retry rule (EXT-RETRY-1) and the preempted attempt's fate (EXT-PREEMPT-2), as the pure
verdict every attempt end reads."""

from __future__ import annotations

import pytest

from resource_controller.core import retry
from resource_controller.core.retry import Attempt, Verdict


def _job(**kw: object) -> Attempt:
    base: dict[str, object] = {
        "kind": "job",
        "attempt": 1,
        "retries": 2,
        "retry_on": "lost",
        "preemptions": 0,
        "kill_requested": False,
        "preempted_by": "",
        "no_requeue": False,
    }
    return Attempt(**{**base, **kw})  # type: ignore[arg-type]


AGAIN, END = Verdict(True, False), Verdict(False, False)


@pytest.mark.parametrize(
    ("retry_on", "state", "expected"),
    [
        ("lost", "lost", AGAIN),
        ("lost", "failed", END),
        ("lost", "killed", END),
        ("failed", "failed", AGAIN),
        ("failed", "lost", END),
        ("any", "lost", AGAIN),
        ("any", "failed", AGAIN),
        ("any", "killed", AGAIN),  # a watchdog's kill, the worker stopping
        ("any", "succeeded", END),
    ],
)
def test_retry_on_names_the_ends_that_retry(retry_on: str, state: str, expected: Verdict) -> None:
    assert retry.verdict(_job(retry_on=retry_on), state) == expected


def test_the_retries_are_counted_and_then_the_job_ends() -> None:
    assert retry.verdict(_job(attempt=2, retries=2), "lost") == AGAIN
    assert retry.verdict(_job(attempt=3, retries=2), "lost") == END
    assert retry.verdict(_job(retries=0), "lost") == END


def test_a_persons_kill_a_hold_and_a_success_never_retry() -> None:
    assert retry.verdict(_job(retry_on="any", kill_requested=True), "killed") == END
    assert retry.verdict(_job(kind="hold"), "lost") == END
    assert retry.verdict(_job(retry_on="any"), "succeeded") == END


def test_a_preempted_attempt_queues_again_apart_from_the_retries() -> None:
    # No retries asked, and the kill flag is the preemption's own.
    victim = _job(retries=0, preempted_by="j-big", kill_requested=False)
    assert retry.verdict(victim, "killed") == Verdict(True, True)
    # Preemptions do not use up retries: attempt 3 after two preemptions is the first retry.
    assert retry.verdict(_job(attempt=3, retries=1, preemptions=2), "lost") == AGAIN
    assert retry.verdict(_job(preempted_by="j-big", no_requeue=True), "killed") == Verdict(
        False, True
    )
    assert retry.preempted_reason("j-big") == "preempted by j-big"
