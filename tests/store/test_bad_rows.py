"""One bad row never stops the fleet (EXT-LIMITS-1, EXT-LIMITS-3).

Rows the API now refuses are written straight into the database, as an older
controller or a hand edit could have left them, and every pass must go on without them.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import TYPE_CHECKING

import pytest

from resource_controller import errors
from resource_controller.store import leases
from resource_controller.store.facade import Store
from resource_controller.store.records import Assigned
from support import store_helpers

from .dbview import Raw, state_of, wid

if TYPE_CHECKING:
    from conftest import Factory

OVERFLOWING = 9_223_372_036_854_775_000  #: now + runtime + 600 does not fit 64 bits


def test_a_job_whose_lease_cannot_be_written_is_skipped(
    store: Store, make: Factory, raw: Raw, caplog: pytest.LogCaptureFixture
) -> None:
    make.worker(devices=2)
    bad = make.submit(device="box:gpu1", priority=10)
    raw.write("UPDATE jobs SET max_runtime_seconds = ? WHERE id = ?", OVERFLOWING, bad.id)
    behind = make.submit(device="box:gpu0")
    same_device = make.submit(device="box:gpu1")
    with caplog.at_level(logging.ERROR, logger="resource_controller.store.leases"):
        assigned = store.queue.run_pass().assigned
    assert assigned == [Assigned(behind.id, wid()), Assigned(same_device.id, wid())]
    assert store.views.job(bad.id).state == "queued"
    assert raw.leases_of(bad.id) == []  # its assignment rolled back whole
    assert bad.id in caplog.text
    # Every later pass still works, and the job can still be cancelled.
    assert store.queue.cancel(bad.id, "killed by admin override")
    store_helpers.release(store, same_device.id, "succeeded", 0)
    assert state_of(store, "box:gpu1")[0] == "ready"


def test_a_row_that_cannot_be_read_is_skipped(store: Store, make: Factory, raw: Raw) -> None:
    make.worker(devices=1)
    bad = make.submit(device="box:gpu0", priority=10)
    raw.write("UPDATE jobs SET command = '[not json' WHERE id = ?", bad.id)
    good = make.submit(device="box:gpu0")
    assert store.queue.run_pass().assigned == [Assigned(good.id, wid())]


def test_a_database_outage_still_fails_the_pass(
    store: Store, make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a fault of one job's data is skipped; a failing database is not a bad row."""
    make.worker(devices=1)
    make.submit(device="box:gpu0")

    def down(*_: object) -> str:
        dbapi_error = sqlite3.OperationalError("disk I/O error")
        raise errors.StoreError("database error") from dbapi_error

    monkeypatch.setattr(leases, "assign", down)
    with pytest.raises(errors.StoreError):
        store.queue.run_pass()


def test_a_stored_negative_runtime_inherits_the_ceiling(
    store: Store, make: Factory, raw: Raw
) -> None:
    """A -1 runtime ran with no watchdog on a device with a ceiling; it now inherits it."""
    make.worker(devices=2, max_runtime_seconds=600)
    pinned = make.submit(device="box:gpu0")
    anywhere = make.submit()
    raw.write("UPDATE jobs SET max_runtime_seconds = -1 WHERE id IN (?, ?)", pinned.id, anywhere.id)
    assert len(store.queue.run_pass().assigned) == 2
    assert store.views.job(pinned.id).max_runtime_seconds == 600
    assert store.views.job(anywhere.id).max_runtime_seconds == 600
