"""Shared fixtures: a fake clock, a Store on a temporary SQLite file, and a small factory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import move_guard
from resource_controller.clock import FakeClock
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.records import JobRecord

# A suite run inside an rc job (``rc run -- make test``) must not see that job: every
# ``rc run`` the tests start would otherwise run under its lease (EXT-NEST-1).
for _name in ("RC_JOB_ID", "RC_DEVICE", "RC_DEVICES", "RC_LEASE_EPOCH"):
    os.environ.pop(_name, None)

#: Fixtures that start real ``rc`` processes: a test using one is end to end.
PROCESS_FIXTURES = frozenset({"cluster", "worker_process"})


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


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store(tmp_path / "rc.db", clock)
    try:
        yield s
    finally:
        s.close()


class Factory:
    """Registers workers and submits jobs with defaults; keyword overrides go to ``NewJob``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def worker(
        self, host: str = "box", devices: int = 2, max_runtime: int = 0, boot_id: str = "boot-1"
    ) -> list[str]:
        """Register ``host`` with ``gpu0..gpu{devices-1}``; return their device IDs."""
        names = [f"gpu{i}" for i in range(devices)]
        self.store.register(host, boot_id, [(n, max_runtime) for n in names])
        return [f"{host}:{n}" for n in names]

    def submit(
        self,
        device: str = "",
        selector: str = "",
        submitter: str = "alice",
        command: tuple[str, ...] = ("train",),
        **kw: Any,
    ) -> JobRecord:
        return self.store.enqueue(
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
        self.store.schedule()
        placed = self.store.job(job.id)
        assert placed.state == "assigned", placed.state
        self.store.take_work(placed.worker_id)
        return self.store.job(job.id)


@pytest.fixture
def make(store: Store) -> Factory:
    return Factory(store)
