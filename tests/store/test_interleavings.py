"""Two and three stores on one database, as several controllers are, driven step by step
in orders hypothesis chooses (``support/interleave.py``): after every step, no wrong
grant and no acknowledged change lost (EXT-PG-7, STORE-180..182). The long runs are
``bench/interleave.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support import interleave, pg

RUNS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _database(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if backend == "sqlite":
        return interleave.fresh_sqlite(tmp_path)
    cluster: pg.Cluster = request.getfixturevalue("pg_cluster")
    return cluster.fresh_database()


Op, Step = interleave.Op, interleave.Step
#: The race a review found: A's report frees a:gpu0 and its pass reads that, then rolls
#: back; B drains a:gpu1 meanwhile; A's next pass must place nothing on a:gpu1.
ROLLED_BACK_VIEW = [
    Step(Op("submit", 0, 0, 0)),  # pinned to a:gpu0, granted
    Step(Op("handout", 0, 0, 0)),
    Step(Op("submit", 0, 0, 0)),  # waits behind it, so the report's pass reads the fleet
    Step(Op("report", 0, 0, 0), fault_at=1, together=Op("drain", 1, 1, 0)),
    Step(Op("submit", 0, 0, 1)),  # any device
]

#: Found by the harness on PostgreSQL: A's report hands a:gpu0 on to the next job while
#: B registers host a again after a reboot; B read the host's jobs before A's grant
#: committed and then made the device ready under the new job's live lease.
REGISTER_BESIDE_A_GRANT = [
    Step(Op("submit", 0, 0, 0)),
    Step(Op("handout", 0, 0, 0)),
    Step(Op("submit", 0, 0, 0)),
    Step(Op("report", 0, 0, 0), together=Op("register", 1, 0, 1)),
]

#: Found by reading the retire beside a pass: B retires a:gpu0 while A's pass grants it;
#: B's check for a live lease ran before A's grant committed.
RETIRE_BESIDE_A_GRANT = [
    Step(Op("fault", 0, 0, 0)),  # a:gpu0 out of the pool
    Step(Op("submit", 0, 0, 0)),  # a job pinned to it waits
    Step(Op("clear", 0, 0, 0)),  # back in the pool: the next pass grants it
    Step(Op("pass", 0, 0, 0), together=Op("retire", 1, 0, 0)),
]


@pytest.mark.parametrize("stores", [2, 3])
@RUNS
@example(plan=ROLLED_BACK_VIEW)
@example(plan=REGISTER_BESIDE_A_GRANT)
@example(plan=RETIRE_BESIDE_A_GRANT)
@given(plan=st.lists(interleave.steps(), min_size=1, max_size=30))
def test_every_interleaving_keeps_one_device_one_job(
    stores: int,
    plan: list[interleave.Step],
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    bad, _ = interleave.run(_database(backend, request, tmp_path), plan, stores)
    assert bad == []
