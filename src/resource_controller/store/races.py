"""Running a store operation again when PostgreSQL rolled it back for a race (the loser wrote
nothing), or once when its connection dropped before the commit."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from resource_controller import errors
from resource_controller.store import sql

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

#: Runs of one operation at most; a race lost this often in a row is an outage.
ATTEMPTS = 5


def again(method: Callable[P, R]) -> Callable[P, R]:
    """``method``, run again while it loses a race, and once more after a drop before commit."""
    return _rerun(method, ATTEMPTS)


def reconnecting(method: Callable[P, R]) -> Callable[P, R]:
    """``method``, run once more when its connection dropped before it committed: a read
    (which loses no race), or an operation around one that is ``again`` already."""
    return _rerun(method, 1)


def _rerun(method: Callable[P, R], attempts: int) -> Callable[P, R]:
    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        attempt, dropped = 1, False
        while True:
            try:
                return method(*args, **kwargs)
            except errors.ConnectionDropped:
                if dropped:
                    raise
                dropped = True
                log.info("%s: the database connection dropped; again on a new one", method.__name__)
            except errors.StoreError as exc:
                if attempt >= attempts or not sql.lost_race(exc.__cause__):
                    raise
                log.info(
                    "%s lost a race with another controller's transaction (%s); again",
                    method.__name__,
                    type(exc.__cause__).__name__,
                )
                attempt += 1

    return run
