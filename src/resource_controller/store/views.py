"""What the controller shows (store.md §20-21)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from resource_controller import errors
from resource_controller.core import expiry, scheduling, selectors, waiting
from resource_controller.core import usage as acct
from resource_controller.core.states import ACTIVE, JobState
from resource_controller.store import attempts, fleet, jobs, leadership, passes, queries, races, sql
from resource_controller.store import usage as rollup
from resource_controller.store.base import Core
from resource_controller.store.records import (
    AttemptRecord,
    DeviceRecord,
    DeviceRecoveries,
    DeviceSnapshot,
    JobRecord,
    LabelRecord,
    LeaseRecord,
    RecoveryEntry,
)

_ACTIVE: tuple[str, ...] = tuple(sorted(s.value for s in ACTIVE))
_LEASE_COLS = ", ".join("leases." + n for n in LeaseRecord._fields)
#: Live leases, with their job's command or without.
_LIVE = f"SELECT {_LEASE_COLS} FROM leases WHERE leases.released_at IS NULL"
_LIVE_WITH_COMMAND = _LIVE.replace(
    " FROM leases", ", jobs.command FROM leases LEFT JOIN jobs ON jobs.id = leases.job_id"
)


class Views:
    """The controller's reads, each in the core's one transaction context (or one read
    outside any), with the fleet view the pass keeps."""

    def __init__(self, core: Core) -> None:
        self._core = core

    @races.reconnecting
    def job(self, job_id: str) -> JobRecord:
        """STORE-160: the job with its newest lease epoch; ``JobNotFound`` when unknown."""
        with self._core.read() as c:
            return queries.job(c, job_id)

    @races.reconnecting
    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """The job's earlier attempts, first first (EXT-RETRY-1)."""
        with self._core.read() as c:
            return attempts.of_job(c, job_id)

    @races.reconnecting
    def list_jobs(self, limit: int = 20, *filters: str, **named: str) -> list[JobRecord]:
        """STORE-161, filtered as the module's ``list_jobs`` is."""
        if not 1 <= limit <= 200:
            raise errors.BadRequest(f"limit must be between 1 and 200, got {limit}")
        with self._core.read() as c:
            return list_jobs(c, limit, *filters, **named)

    @races.reconnecting
    def queued(self) -> list[JobRecord]:
        """STORE-071: queued jobs in scheduling order, aged now when aging is on."""
        with self._core.tx() as c:
            return _queued(c, self._core.now(), self._core.aging)

    @races.reconnecting
    def active(self) -> list[JobRecord]:
        """STORE-072: assigned and running jobs, newest submission first."""
        with self._core.tx() as c:
            return _active(c)

    @races.reconnecting
    def devices(self, device_id: str | None = None) -> list[DeviceSnapshot]:
        """STORE-163: every device (or one) with its labels and live lease, by ID."""
        with self._core.tx() as c:
            return device_snapshots(c, device_id, kept=self._core.fleet)

    @races.reconnecting
    def state_view(
        self,
    ) -> tuple[
        list[DeviceSnapshot], list[JobRecord], list[JobRecord], dict[str, list[waiting.Blocker]]
    ]:
        """Devices, active jobs, the queue and what each queued job waits for, in one
        transaction: one gathering for the whole queue, not a read per job."""
        core = self._core
        with core.tx() as c:
            now = core.now()
            queued = _queued(c, now, core.aging)
            waits = jobs.waiting_for_all(c, core, queued, now)
            active = _active(c)
            held = device_snapshots(c, commands={j.id: j.command for j in active}, kept=core.fleet)
            return held, active, queued, waits

    @races.reconnecting
    def describe(self, device_id: str) -> Description | None:
        """Everything describe shows of a device, read in one transaction."""
        with self._core.tx() as c:
            snaps = device_snapshots(c, device_id)
            if not snaps:
                return None
            return Description(
                snapshot=snaps[0],
                sheet=_sheet_for(c, snaps[0].device),
                recent_jobs=list_jobs(c, 5, device_id),  # STORE-162
                recoveries=recovery_history(c, self._core.now(), device_id),
            )

    @races.reconnecting
    def explain(self, text: str) -> SelectorExplanation:
        """What a selector would match right now, from the store's fleet view."""
        parsed = selectors.parse(text)
        with self._core.tx() as c:
            _, snaps = self._core.fleet.read(c)
            matching = scheduling.matching(parsed, snaps)
            ids = {d.id for d in matching}
            depth = sum(scheduling.competes(j.snap(), ids, snaps) for j in _queued(c))
            return SelectorExplanation(
                selector=text,
                matching=sorted(ids),
                free=[d.id for d in matching if d.schedulable],
                queue_depth=depth,
                hint="" if ids else selectors.no_match_hint(parsed, [d.labels for d in snaps]),
            )

    @races.reconnecting
    def active_job_on(self, device_id: str) -> str:
        """STORE-074: the newest assigned/running job on a device, or ''; for fault events."""
        on, params = queries.on_device(device_id)
        with self._core.read() as c:
            found = c.value(
                f"SELECT id FROM jobs WHERE {on} AND state IN (?, ?)"
                " ORDER BY submitted_at DESC, seq DESC LIMIT 1",
                (*params, str(JobState.ASSIGNED), str(JobState.RUNNING)),
            )
        return str(found) if found else ""

    @races.reconnecting
    def held_by_share(self) -> dict[str, int]:
        """The devices each share name holds now (EXT-SHARE-1, ``/metrics``)."""
        with self._core.read() as c:
            return passes.held_by_share(c)

    @races.reconnecting
    def metric_counts(
        self,
    ) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]:
        """Devices and jobs by state, hosts' last heartbeats, devices held per share name."""
        with self._core.tx() as c:

            def counts(text: str) -> dict[str, int]:
                return {str(k): int(n) for k, n in c.all(text)}

            jobs = counts("SELECT state, count(*) FROM jobs GROUP BY state")
            jobs[PREEMPTIONS] = int(c.value(_PREEMPTIONS) or 0)
            return (
                counts("SELECT state, count(*) FROM devices GROUP BY state"),
                jobs,
                counts("SELECT host, max(last_heartbeat_at) FROM workers GROUP BY host"),
                passes.held_by_share(c),
            )

    @races.reconnecting
    def usage(self, by: str, since: int, limit: int = acct.MAX_GROUPS) -> acct.Window:
        """Who held what over the last ``since`` seconds, by ``by``: two rows per group."""
        acct.check_by(by)
        with self._core.read() as c:
            now = self._core.now()
            first = acct.window_start(now, since)
            groups = rollup.window(c, by, first)
        return acct.summarise(by, first * acct.HOUR, now, groups, limit)

    @races.reconnecting
    def usage_pairs(self, within: int) -> list[rollup.PairTotals]:
        """Totals of the device-and-submitter pairs active in the last ``within`` seconds."""
        with self._core.read() as c:
            return rollup.recent_pairs(c, acct.window_start(self._core.now(), within))

    @races.reconnecting
    def quarantine_reasons(self, ids: list[str]) -> dict[str, str]:
        """STORE-170: device ID -> its current ``quarantine_reason``, for every ID with a row."""
        if not ids:
            return {}
        with self._core.read() as c:
            rows = c.all(
                f"SELECT id, quarantine_reason FROM devices WHERE {queries.id_in(len(ids))}", ids
            )
        return {str(device_id): str(reason) for device_id, reason in rows}

    @races.reconnecting
    def lease_devices(self, ids: list[str]) -> dict[str, str]:
        """STORE-171, after a sweep: lease or job ID -> device, from live or released lease
        rows (the only link left to a device just quarantined), the newest winning."""
        if not ids:
            return {}
        out: dict[str, str] = {}
        with self._core.read() as c:
            rows = c.all(
                f"SELECT id, job_id, device_id FROM leases WHERE {queries.id_in(len(ids))}"
                f" OR job_id IN ({sql.marks(len(ids))}) ORDER BY acquired_at, id",
                (*ids, *ids),
            )
        for lease_id, job_id, device_id in rows:
            out.update({lease_id: device_id, job_id or lease_id: device_id})
        return out

    @races.reconnecting
    def logs_to_prune(
        self, retention: int, limit: int, fence: leadership.Fence | None = None
    ) -> list[str]:
        """Up to ``limit`` jobs ended over ``retention`` seconds ago whose output is still
        stored, oldest end first; for the leader of ``fence`` only (``NotLeading`` else)."""
        with self._core.tx() as c:
            leadership.hold(c, fence)
            rows = c.all(
                "SELECT id FROM jobs WHERE logs_pruned = 0 AND finished_at IS NOT NULL"
                " AND finished_at < ? ORDER BY finished_at, id LIMIT ?",
                (self._core.now() - retention, limit),
            )
        return [str(job_id) for (job_id,) in rows]

    @races.again
    def mark_logs_pruned(self, job_ids: list[str], fence: leadership.Fence | None = None) -> None:
        """Record that these jobs' stored output is gone; the job rows stay."""
        with self._core.tx() as c:
            leadership.hold(c, fence)
            if job_ids:
                c.execute(
                    f"UPDATE jobs SET logs_pruned = 1 WHERE {queries.id_in(len(job_ids))}", job_ids
                )


@dataclass(frozen=True)
class Sheet:
    body: str
    updated_at: int | None
    host_wide: bool


@dataclass(frozen=True)
class Description:
    """What describe shows for one device, plus its flap-guard history."""

    snapshot: DeviceSnapshot
    sheet: Sheet
    recent_jobs: list[JobRecord]
    recoveries: DeviceRecoveries


@dataclass(frozen=True)
class SelectorExplanation:
    selector: str
    matching: list[str]
    free: list[str]
    queue_depth: int
    #: When nothing matches, what the devices have for the selector's keys; else "".
    hint: str = ""


def list_jobs(
    conn: sql.Db,
    limit: int,
    device: str = "",
    submitter: str = "",
    state: str = "",
    id_prefix: str = "",
    before: str = "",
) -> list[JobRecord]:
    """Newest first, ties by ID descending, with lease epochs; ``id_prefix`` a plain prefix (never
    a pattern); ``before``: the jobs after that one (a page)."""
    where: list[str] = []
    params: list[Any] = []
    if device:
        text, args = queries.on_device(device)
        where.append(text)
        params += args
    if before:
        at = conn.value("SELECT submitted_at FROM jobs WHERE id = ?", (before,))
        if at is None:
            raise errors.BadRequest(f"before: no job has the ID {before[:40]!r}")
        where.append("(jobs.submitted_at < ? OR (jobs.submitted_at = ? AND jobs.id < ?))")
        params += [at, at, before]
    for column, value in (("submitter", submitter), ("state", state)):
        if value:
            where.append(f"jobs.{column} = ?")
            params.append(value)
    if id_prefix:
        where.append("substr(jobs.id, 1, ?) = ?")
        params += [len(id_prefix), id_prefix]
    order = "jobs.submitted_at DESC, jobs.id DESC"
    return queries.jobs_where(conn, " AND ".join(where), params, order, limit, epochs=True)


def _queued(conn: sql.Db, now: int = 0, aging: int = 0) -> list[JobRecord]:
    """Queued jobs in scheduling order, aged at ``now`` when on."""
    order = queries.queue_order(now, aging)
    return queries.jobs_where(conn, "jobs.state = ?", (str(JobState.QUEUED),), order=order)


def _active(conn: sql.Db) -> list[JobRecord]:
    """Active jobs, newest first, with their lease epochs (``/v1/state``)."""
    where, order = (
        f"jobs.state IN ({sql.marks(len(_ACTIVE))})",
        "jobs.submitted_at DESC, jobs.seq DESC",
    )
    return queries.jobs_where(conn, where, _ACTIVE, order, epochs=True)


def device_snapshots(
    conn: sql.Db,
    device_id: str | None = None,
    commands: dict[str, list[str]] | None = None,
    kept: fleet.FleetSnapshot | None = None,
) -> list[DeviceSnapshot]:
    """Every device (or one) with its labels and live lease; ``commands`` spares decoding."""
    text = _LIVE if commands is not None else _LIVE_WITH_COMMAND
    if device_id is None:
        rows, labels = (kept or fleet.FleetSnapshot()).current(conn)
        live = conn.execute(text)
    else:
        found = queries.device(conn, device_id)
        rows = [found] if found else []
        labels = fleet.label_rows(conn, [device_id])
        live = conn.execute(text + " AND leases.device_id = ?", (device_id,))
    held: dict[str, tuple[LeaseRecord, list[str] | None]] = {}
    for row in live:
        if commands is not None:
            lease = LeaseRecord._make(row)
            held[lease.device_id] = (lease, commands.get(lease.job_id))
        else:
            lease = LeaseRecord._make(row[:-1])
            held[lease.device_id] = (lease, json.loads(row[-1]) if row[-1] else None)
    none = (None, None)
    no_labels: list[LabelRecord] = []
    snapshot = DeviceSnapshot._make
    return [snapshot((d, labels.get(d.id, no_labels), *held.get(d.id, none))) for d in rows]


def _sheet_for(conn: sql.Db, device: DeviceRecord) -> Sheet:
    """STORE-154: the device's own usage sheet, or the host-wide one when its body is empty."""
    rows = conn.all(
        "SELECT device_id, body, updated_at FROM host_docs WHERE host = ? AND device_id IN (?, '')",
        (device.host, device.id),
    )
    sheets = {device_id: (str(body), at) for device_id, body, at in rows}
    body, at = sheets.get(device.id, ("", None))
    if body:
        return Sheet(body, at, False)
    return Sheet(*sheets.get("", ("", None)), True)


def recovery_history(conn: sql.Db, now: int, device_id: str) -> DeviceRecoveries:
    """STORE-123: the device's recoveries inside the window, newest first (pruning is lazy)."""
    rows = conn.all(
        "SELECT at, reason FROM device_recoveries WHERE device_id = ? AND at >= ?"
        " ORDER BY at DESC, reason",
        (device_id, expiry.flap_cutoff(now)),
    )
    return DeviceRecoveries(
        recoveries=[RecoveryEntry(at=int(at), reason=reason) for at, reason in rows],
        remaining=expiry.flap_remaining(len(rows)),
        limit=expiry.FLAP_LIMIT,
        window=expiry.FLAP_WINDOW,
    )


#: Beside the job states in ``metric_counts``: the attempts preemption ended (EXT-PREEMPT-3).
PREEMPTIONS = "preemptions"
_PREEMPTIONS = (
    "SELECT sum(preemptions) + sum(CASE WHEN no_requeue = 1 AND state = 'killed'"
    " AND kill_reason LIKE 'preempted by %' THEN 1 ELSE 0 END) FROM jobs"
)
