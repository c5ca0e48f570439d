"""The fleet as the scheduling rules read it, kept between passes.

Every pass and every submit for a selector or any device reads the whole fleet: at
10,000 devices that read (rows, labels, snapshots) was 10-15 ms of a 1,000-device pass
and most of a submit. The triggers of migration 0006 note in ``device_changes`` each
device whose scheduled columns or labels changed, at a rising ``fleet_version``; this
snapshot rereads only the devices noted since it last looked, so a pass after a grant
reads one device, and a heartbeat that only stamps ``last_heartbeat_at`` costs nothing.

What it keeps is for the scheduling rules only: the ``DeviceSnap``s, and the device
records the pass hands to ``leases.assign`` (which reads their ID, worker and runtime
ceiling). Their other columns (``last_heartbeat_at``, quarantine details) may be stale.
Staleness cannot hand out a device twice in any case: each assignment re-checks the
device inside its transaction and the unique index referees the lease (STORE-063).
"""

from __future__ import annotations

from resource_controller.core.scheduling import DeviceSnap
from resource_controller.store import fast
from resource_controller.store.records import DeviceRecord

_CHANGED = "SELECT device_id, version FROM device_changes WHERE version > ?"
_NEWEST = "SELECT max(version) FROM device_changes"
_CHUNK = 500  #: ids per ``IN (...)`` read, well under SQLite's parameter limit


class FleetSnapshot:
    """Devices by ID with their scheduling snapshots, brought up to date on each read."""

    def __init__(self) -> None:
        self._version = -1  #: the newest ``device_changes.version`` seen; -1 = never read
        self._records: dict[str, DeviceRecord] = {}
        self._snaps: dict[str, DeviceSnap] = {}
        self._ordered: list[DeviceSnap] = []

    def read(self, conn: fast.Conn) -> tuple[dict[str, DeviceRecord], list[DeviceSnap]]:
        """(records by ID, snapshots by ID ascending), current as of this read. The
        caller holds the store's lock; the returned objects must not be changed."""
        db = fast.raw(conn)
        if self._version < 0:
            self._full(db)
        else:
            changed = db.execute(_CHANGED, (self._version,)).fetchall()
            if changed:
                self._version = max(v for _, v in changed)
                self._reread(db, [d for d, _ in changed])
        return self._records, self._ordered

    def _full(self, db: fast.Conn) -> None:
        # The mark first: a change between it and the read is reread next time.
        newest = fast.raw(db).execute(_NEWEST).fetchone()[0]
        devices = fast.all_devices(db)
        labels = fast.effective_labels(db)
        self._records = {d.id: d for d in devices}
        self._snaps = {d.id: d.snap(labels.get(d.id)) for d in devices}
        self._ordered = [self._snaps[d.id] for d in devices]  # all_devices is by ID
        self._version = int(newest or 0)

    def _reread(self, db: fast.Conn, ids: list[str]) -> None:
        known = len(self._snaps)
        seen: set[str] = set()
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            labels = fast.labels_of(db, chunk)
            for device in fast.devices_by_id(db, chunk):
                seen.add(device.id)
                self._records[device.id] = device
                self._snaps[device.id] = device.snap(labels.get(device.id))
        gone = [d for d in ids if d not in seen]
        for device_id in gone:
            self._records.pop(device_id, None)
            self._snaps.pop(device_id, None)
        if gone or len(self._snaps) != known:
            self._ordered = [self._snaps[d] for d in sorted(self._snaps)]
        else:
            self._ordered = [self._snaps[s.id] for s in self._ordered]
