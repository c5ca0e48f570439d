"""A partition: a worker behind the fault proxy goes silent while running a job.

The spec's timings (grace 30 s, write-off 5 min, sweep 10 s, heartbeat 10 s) scaled by
1/15 through the test hooks; the device must go ``unknown`` after the grace and
``unhealthy`` (``worker_lost``) after the write-off, counted from the worker's last
contact, and the job queued for it must not be granted before a proof
(``bench/partition.py`` runs many trials, at any scale).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import partition

pytestmark = pytest.mark.e2e

SCALE = 1 / 15
GRACE = partition.GRACE * SCALE  # 2 s
WRITE_OFF = partition.UNHEALTHY_AFTER * SCALE  # 20 s
SWEEP = partition.SWEEP * SCALE
#: Stored heartbeats are whole seconds (STORE-004): a verdict may come up to 1 s early.
EARLY, LATE = 1.05, SWEEP + 1.5


@pytest.mark.timeout(100)
def test_a_black_holed_worker_goes_unknown_then_unhealthy_and_its_device_stays_out(
    tmp_path: Path,
) -> None:
    r = partition.trial(tmp_path, scale=SCALE, heal_wait=3)
    assert r.unknown_after is not None and r.unhealthy_after is not None, r
    assert GRACE - EARLY <= r.unknown_after <= GRACE + LATE, r
    assert WRITE_OFF - EARLY <= r.unhealthy_after <= WRITE_OFF + LATE, r
    # The ratio of the two verdicts is the spec's (300 / 30), within the resolution.
    assert r.unhealthy_after / r.unknown_after >= (WRITE_OFF - EARLY) / (GRACE + LATE)
    assert r.reason == "worker_lost"
    assert r.grants_before_proof == 0, r.notes
    assert r.exclusivity_violations == 0
    assert r.a_final == "lost", "a late report after the write-off changed the job's end"
