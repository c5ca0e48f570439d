"""The usage rollup (migration 0011): running totals per group and the sums at each active hour's
end, so a window is two rows a group."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from resource_controller.core import usage
from resource_controller.store import sql

#: ``dim`` of the device-and-submitter groups, keyed ``"<device> <holder>"`` (IDs hold no space).
PAIR = "pair"


@dataclass(frozen=True, order=True)
class Held:
    """One released lease: what it held, for whom, and for how long."""

    device_id: str
    holder: str
    #: The job it was granted for; a job-less lease counts as a job of its own.
    job_id: str
    seconds: int


@functools.cache
def _totals_sql(n: int) -> str:
    """The upsert of ``n`` groups' totals, returning them as they now stand."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * n)
    return (
        "INSERT INTO usage_totals (dim, key, last_hour, jobs, held_seconds,"
        f" sampled_seconds, weighted_seconds, last_util) VALUES {values}"
        " ON CONFLICT (dim, key) DO UPDATE SET"
        # Never back in time: a mark before one already written would break the running sums.
        " last_hour = CASE WHEN excluded.last_hour > usage_totals.last_hour"
        " THEN excluded.last_hour ELSE usage_totals.last_hour END,"
        " jobs = usage_totals.jobs + excluded.jobs,"
        " held_seconds = usage_totals.held_seconds + excluded.held_seconds,"
        " sampled_seconds = usage_totals.sampled_seconds + excluded.sampled_seconds,"
        " weighted_seconds = usage_totals.weighted_seconds + excluded.weighted_seconds,"
        " last_util = coalesce(excluded.last_util, usage_totals.last_util)"
        " RETURNING dim, key, last_hour, jobs, held_seconds, sampled_seconds,"
        " weighted_seconds"
    )


@functools.cache
def _marks_sql(n: int) -> str:
    """The upsert of ``n`` groups' sums at the end of an hour."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * n)
    return (
        "INSERT INTO usage_marks (dim, key, hour, jobs, held_seconds, sampled_seconds,"
        f" weighted_seconds) VALUES {values}"
        " ON CONFLICT (dim, key, hour) DO UPDATE SET jobs = excluded.jobs,"
        " held_seconds = excluded.held_seconds,"
        " sampled_seconds = excluded.sampled_seconds,"
        " weighted_seconds = excluded.weighted_seconds"
    )


def account(db: sql.Db, now: int, held: Sequence[Held], util: float | None = None) -> None:
    """Add one job's released leases to each group, so the job counts once; ``util`` weights."""
    if not held:
        return
    sums: dict[tuple[str, str], tuple[int, int, float]] = {}
    jobs: dict[tuple[str, str], set[str]] = {}
    for h in held:
        secs = max(0, int(h.seconds))
        sampled = secs if util is not None else 0
        weighted = secs * util / 100.0 if util is not None else 0.0
        job = h.job_id or f"lease:{h.device_id}"
        for group in (
            ("submitter", h.holder),
            ("device", h.device_id),
            ("host", h.device_id.split(":", 1)[0]),
            (PAIR, f"{h.device_id} {h.holder}"),
        ):
            was = sums.get(group, (0, 0, 0.0))
            sums[group] = (was[0] + secs, was[1] + sampled, was[2] + weighted)
            jobs.setdefault(group, set()).add(job)
    hour = now // usage.HOUR
    params: list[object] = []
    for (dim, key), (secs, sampled, weighted) in sums.items():
        params += [dim, key, hour, len(jobs[(dim, key)]), secs, sampled, weighted, util]
    rows = db.execute(_totals_sql(len(sums)), params).fetchall()
    db.execute(_marks_sql(len(rows)), [value for row in rows for value in row])


_WINDOW = (
    "SELECT t.key, t.jobs, t.held_seconds, t.sampled_seconds, t.weighted_seconds,"
    " b.jobs, b.held_seconds, b.sampled_seconds, b.weighted_seconds"
    " FROM usage_totals t LEFT JOIN usage_marks b"
    " ON b.dim = t.dim AND b.key = t.key AND b.hour = ("
    "SELECT x.hour FROM usage_marks x WHERE x.dim = t.dim AND x.key = t.key AND x.hour < ?"
    " ORDER BY x.hour DESC LIMIT 1)"
    " WHERE t.dim = ? AND t.last_hour >= ?"
)


def window(db: sql.Db, dim: str, first_hour: int) -> list[usage.Group]:
    """Each group of ``dim`` active since the start of ``first_hour``, with its sums
    since then (totals minus the last mark before it): two rows read per group."""
    out = []
    for key, jobs, held, sampled, weighted, *mark in db.execute(
        _WINDOW, (first_hour, dim, first_hour)
    ):
        now = usage.Figures(int(jobs), int(held), int(sampled), float(weighted))
        b_jobs, b_held, b_sampled, b_weighted = (v or 0 for v in mark)
        before = usage.Figures(int(b_jobs), int(b_held), int(b_sampled), float(b_weighted))
        out.append(usage.Group(str(key), now - before))
    return out


@dataclass(frozen=True)
class PairTotals:
    """One device-and-submitter group's running totals, for ``/metrics``."""

    device_id: str
    submitter: str
    held_seconds: int
    #: The mean GPU utilisation of its latest job that reported one; None if none did.
    last_util: float | None


def recent_pairs(db: sql.Db, first_hour: int) -> list[PairTotals]:
    rows = db.execute(
        "SELECT key, held_seconds, last_util FROM usage_totals"
        " WHERE dim = ? AND last_hour >= ? ORDER BY key",
        (PAIR, first_hour),
    )
    out = []
    for key, held, util in rows:
        device, _, holder = str(key).partition(" ")
        out.append(PairTotals(device, holder, int(held), None if util is None else float(util)))
    return out
