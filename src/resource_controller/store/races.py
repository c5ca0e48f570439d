"""Running a store operation again when PostgreSQL rolled it back for a race with
another controller's transaction.

Several controllers write the same rows: the device counters their triggers keep, the
count of devices each submitter holds, the lease epoch. Transactions that take such
rows in different orders can deadlock, and the server then rolls one of them back. The
loser wrote nothing, so running it again is safe, and it then sees the winner's commit:
a grant that loses such a race is retried, never answered with a 500. Any other error
goes up as it came.
"""

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
    """``method`` (one store operation), run again while it loses a race."""

    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        attempt = 1
        while True:
            try:
                return method(*args, **kwargs)
            except errors.StoreError as exc:
                if attempt >= ATTEMPTS or not sql.lost_race(exc.__cause__):
                    raise
                log.info(
                    "%s lost a race with another controller's transaction (%s); again",
                    method.__name__,
                    type(exc.__cause__).__name__,
                )
                attempt += 1

    return run
