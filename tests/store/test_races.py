"""A store operation that PostgreSQL rolled back for a race with another controller
runs again (EXT-PG-7); any other failure goes up at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from resource_controller import errors
from resource_controller.store import races


class _Driver(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _failing(states: list[str]) -> tuple[list[int], Callable[[int], int]]:
    calls: list[int] = []

    @races.again
    def op(x: int) -> int:
        calls.append(x)
        if len(calls) <= len(states):
            raise errors.StoreError("database error") from _Driver(states[len(calls) - 1])
        return x * 2

    return calls, op


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])  # deadlock, serialization failure
def test_a_lost_race_runs_the_operation_again(sqlstate: str) -> None:
    calls, op = _failing([sqlstate, sqlstate])
    assert op(21) == 42
    assert calls == [21, 21, 21]


def test_any_other_database_error_goes_up_at_once() -> None:
    calls, op = _failing(["23505"])
    with pytest.raises(errors.StoreError):
        op(1)
    assert calls == [1]


def test_a_race_lost_every_time_gives_up_after_a_bound() -> None:
    calls, op = _failing(["40P01"] * 100)
    with pytest.raises(errors.StoreError):
        op(1)
    assert len(calls) == races.ATTEMPTS
