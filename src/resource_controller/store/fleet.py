"""The fleet as the pass and views read it, reread only where migration 0006/0008's triggers noted a
change (a whole read was most of a submit); ``leases.assign`` re-checks."""

from __future__ import annotations

from resource_controller.core.planner import FleetIndex
from resource_controller.core.scheduling import DeviceSnap
from resource_controller.store import queries, sql
from resource_controller.store.records import DeviceRecord, LabelRecord

_CHANGED = "SELECT device_id, version FROM device_changes WHERE version > ?"
_NEWEST = "SELECT max(version) FROM device_changes"
_HEARTBEATS = "SELECT id, last_heartbeat_at FROM devices"
_LABEL_ROWS = "SELECT device_id, key, value, source, updated_at FROM device_labels"
_LABEL_ORDER = " ORDER BY device_id, key, source"
_CHUNK = 500  #: ids per ``IN (...)`` read, well under SQLite's parameter limit
_label = LabelRecord._make


def label_rows(db: sql.Db, ids: list[str] | None = None) -> dict[str, list[LabelRecord]]:
    """Label records by device, by key then source; every device's, or those of ``ids``."""
    if ids is None:
        rows = db.execute(_LABEL_ROWS + _LABEL_ORDER)
    else:
        where = f" WHERE device_id IN ({sql.marks(len(ids))})"
        rows = db.execute(_LABEL_ROWS + where + _LABEL_ORDER, tuple(ids))
    out: dict[str, list[LabelRecord]] = {}
    for label in map(_label, rows):
        out.setdefault(label.device_id, []).append(label)
    return out


def effective(labels: list[LabelRecord] | None) -> dict[str, str] | None:
    """Key -> effective value: declared, overlaid by detected. ``labels`` in
    key-then-source order, so for each key the detected value comes last and wins."""
    if not labels:
        return None
    return {lb.key: lb.value for lb in labels}


class FleetSnapshot:
    """Devices by ID with labels and snapshots, updated in place: use under the store's lock."""

    def __init__(self) -> None:
        self._version = -1  #: the newest ``device_changes.version`` seen; -1 = never read
        self._records: dict[str, DeviceRecord] = {}
        self._labels: dict[str, list[LabelRecord]] = {}
        self._snaps: dict[str, DeviceSnap] = {}
        self._ordered: list[DeviceSnap] = []
        self._position: dict[str, int] = {}  #: device ID -> its index in ``_ordered``
        self._index = FleetIndex([])

    def forget(self) -> None:
        """Reread everything next time."""
        self._version = -1

    @property
    def seen(self) -> int:
        """How far this view has read the change notes; a transaction notes it first."""
        return self._version

    def rolled_back(self, seen: int) -> None:
        """A transaction that began at ``seen`` rolled back: the view is read afresh."""
        if self._version != seen:
            self.forget()

    def read(self, db: sql.Db) -> tuple[dict[str, DeviceRecord], list[DeviceSnap]]:
        """(records by ID, snapshots by ID), current but for the records' heartbeat stamps."""
        if self._version < 0:
            self._full(db)
        else:
            changed = db.execute(_CHANGED, (self._version,)).fetchall()
            if changed:
                self._version = max(v for _, v in changed)
                self._reread(db, [d for d, _ in changed])
        return self._records, self._ordered

    def index(self, conn: sql.Db) -> tuple[dict[str, DeviceRecord], FleetIndex]:
        """``read``, with the snapshots as the planner's index of them (kept too)."""
        records, _ = self.read(conn)
        return records, self._index

    def current(self, db: sql.Db) -> tuple[list[DeviceRecord], dict[str, list[LabelRecord]]]:
        """Every device record by ID, current in every column, and the labels by device:
        the views' read, one two-column scan of ``devices`` beside the changes."""
        records, ordered = self.read(db)
        stamps = dict(db.execute(_HEARTBEATS).fetchall())
        if stamps.keys() != records.keys():  # a device the notes missed: no writer does
            self.forget()
            records, ordered = self.read(db)
        out: list[DeviceRecord] = []
        for snap in ordered:
            record = records[snap.id]
            stamp = stamps[snap.id]
            if record.last_heartbeat_at != stamp:
                record = records[snap.id] = record._replace(last_heartbeat_at=stamp)
            out.append(record)
        return out, self._labels

    def _full(self, db: sql.Db) -> None:
        # The mark first: a change between it and the read is reread next time.
        newest = db.value(_NEWEST)
        devices = queries.all_devices(db)
        self._labels = label_rows(db)
        self._records = {d.id: d for d in devices}
        self._snaps = {d.id: d.snap(effective(self._labels.get(d.id))) for d in devices}
        self._ordered = [self._snaps[d.id] for d in devices]  # all_devices is by ID
        self._position = {d.id: i for i, d in enumerate(devices)}
        self._index = FleetIndex(self._ordered)
        self._version = int(newest or 0)

    def _reread(self, db: sql.Db, ids: list[str]) -> None:
        known = len(self._snaps)
        seen: set[str] = set()
        changed: list[DeviceSnap] = []
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            labels = label_rows(db, chunk)
            for device_id in chunk:
                if device_id in labels:
                    self._labels[device_id] = labels[device_id]
                else:
                    self._labels.pop(device_id, None)
            for device in queries.devices_by_id(db, chunk):
                seen.add(device.id)
                self._records[device.id] = device
                snap = self._snaps[device.id] = device.snap(effective(labels.get(device.id)))
                changed.append(snap)
        gone = [d for d in ids if d not in seen]
        for device_id in gone:
            self._records.pop(device_id, None)
            self._snaps.pop(device_id, None)
            self._labels.pop(device_id, None)
        if gone or len(self._snaps) != known:
            self._ordered = [self._snaps[d] for d in sorted(self._snaps)]
            self._position = {d.id: i for i, d in enumerate(self._ordered)}
        else:
            # The same devices: each changed snapshot takes its place (rebuilding the list cost most
            # of a pass).
            for snap in changed:
                self._ordered[self._position[snap.id]] = snap
        self._index.update(self._ordered, changed, gone)
