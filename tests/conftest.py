"""Shared fixtures: a fake clock, a Store on a fresh database, and a small factory.

The database is a temporary SQLite file, or with ``--backend postgresql`` (or
``RC_TEST_BACKEND=postgresql``) a fresh database on a PostgreSQL cluster the session
starts itself (``support/pg.py``). Tests that are about SQLite itself (its file, its
pragmas) carry the ``sqlite_only`` marker and are skipped on PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import move_guard
from resource_controller.clock import FakeClock
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.records import JobRecord
from support import pg

# A suite run inside an rc job (``rc run -- make test``) must not see that job: every
# ``rc run`` the tests start would otherwise run under its lease (EXT-NEST-1).
for _name in ("RC_JOB_ID", "RC_DEVICE", "RC_DEVICES", "RC_LEASE_EPOCH"):
    os.environ.pop(_name, None)

#: Fixtures that start real ``rc`` processes: a test using one is end to end.
PROCESS_FIXTURES = frozenset({"cluster", "worker_process"})


BACKENDS = ("sqlite", "postgresql")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=BACKENDS,
        default=os.environ.get("RC_TEST_BACKEND", "sqlite"),
        help="the database the store fixtures open (default: RC_TEST_BACKEND, else sqlite)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: a test of SQLite itself (its file, pragmas)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Apply the ``e2e`` marker to every test that starts real processes.

    ``make test-fast`` deselects them (``-m "not e2e"``) for the edit-test loop; the
    marker follows the test's place (``tests/e2e/``) or its fixtures, so a new
    end-to-end test cannot forget it.
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "e2e" in item.path.parts or fixtures & PROCESS_FIXTURES:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def state_writes_go_through_moves() -> Iterator[None]:
    """Every test: no statement wrote a job or device state outside ``store.moves``."""
    move_guard.install()
    move_guard.bypasses.clear()
    yield
    found = list(move_guard.bypasses)
    move_guard.bypasses.clear()
    assert found == [], f"state written outside store.moves: {found}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--backend"))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[pg.Cluster]:
    """The session's PostgreSQL cluster, its template migrated, started on first use
    (whatever ``--backend``: the several-controller tests need one on either)."""
    try:
        cluster = pg.start()
    except (OSError, subprocess.SubprocessError) as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"cannot start a PostgreSQL cluster here ({exc})")
    try:
        Store(cluster.url(pg.TEMPLATE), FakeClock()).close()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def database(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> Path | str:
    """Where a test's store lives: a SQLite file in ``tmp_path``, or a fresh PostgreSQL
    database (its URL). A test of SQLite itself is skipped on PostgreSQL."""
    if backend == "sqlite":
        return tmp_path / "rc.db"
    if request.node.get_closest_marker("sqlite_only"):
        pytest.skip("a test of SQLite itself")
    cluster: pg.Cluster = request.getfixturevalue("pg_cluster")
    url: str = cluster.fresh_database()
    return url


def _opened(database: Path | str, clock: FakeClock) -> Iterator[Store]:
    s = Store(database, clock)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def store(database: Path | str, clock: FakeClock) -> Iterator[Store]:
    yield from _opened(database, clock)


@pytest.fixture
def other_store(database: Path | str, clock: FakeClock) -> Iterator[Store]:
    """A second store on the same database: another controller (another process)."""
    yield from _opened(database, clock)


class Factory:
    """Registers workers and submits jobs with defaults; keyword overrides go to ``NewJob``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def worker(
        self,
        host: str = "box",
        devices: int = 2,
        max_runtime_seconds: int = 0,
        boot_id: str = "boot-1",
    ) -> list[str]:
        """Register ``host`` with ``gpu0..gpu{devices-1}``; return their device IDs."""
        names = [f"gpu{i}" for i in range(devices)]
        self.store.devices.register(host, boot_id, [(n, max_runtime_seconds) for n in names])
        return [f"{host}:{n}" for n in names]

    def submit(
        self,
        device: str = "",
        selector: str = "",
        submitter: str = "alice",
        command: tuple[str, ...] = ("train",),
        **kw: Any,
    ) -> JobRecord:
        return self.store.queue.enqueue(
            NewJob(
                command=list(command),
                submitter=submitter,
                device_id=device,
                selector=selector,
                **kw,
            )
        )

    def start(self, device: str = "", **kw: Any) -> JobRecord:
        """Submit, run a scheduling pass and hand the job out; return it as now stored."""
        job = self.submit(device=device, **kw)
        self.store.queue.run_pass()
        placed = self.store.views.job(job.id)
        assert placed.state == "assigned", placed.state
        self.store.reports.take_work(placed.worker_id)
        return self.store.views.job(job.id)


@pytest.fixture
def make(store: Store) -> Factory:
    return Factory(store)
