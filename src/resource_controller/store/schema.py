"""The tables as SQLAlchemy metadata (store.md §2), which the migrations create exactly. No foreign
keys: job history outlives the hardware."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

workers = sa.Table(
    "workers",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("boot_id", sa.Text, nullable=False, server_default=""),
    sa.Column("last_heartbeat_at", sa.BigInteger, nullable=False),
)

devices = sa.Table(
    "devices",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("worker_id", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("last_heartbeat_at", sa.BigInteger, nullable=False),
    sa.Column("max_runtime_seconds", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("quarantine_reason", sa.Text, nullable=False, server_default=""),
    sa.Column("quarantine_detail", sa.Text, nullable=False, server_default=""),
    #: Finish what runs, take nothing new: a flag beside the state, with who, when and why.
    sa.Column("draining", sa.Integer, nullable=False, server_default="0"),
    sa.Column("drained_by", sa.Text, nullable=False, server_default=""),
    sa.Column("drained_at", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("drain_reason", sa.Text, nullable=False, server_default=""),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False, unique=True),
    sa.Column("selector", sa.Text, nullable=False, server_default=""),
    sa.Column("command", sa.Text, nullable=False),
    sa.Column("cwd", sa.Text, nullable=False, server_default=""),
    sa.Column("env", sa.Text, nullable=True),
    sa.Column("submitter", sa.Text, nullable=False),
    sa.Column("idempotency_key", sa.Text, nullable=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("device_id", sa.Text, nullable=False, server_default=""),
    sa.Column("worker_id", sa.Text, nullable=False, server_default=""),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("kill_reason", sa.Text, nullable=False, server_default=""),
    sa.Column("submitted_at", sa.BigInteger, nullable=False),
    sa.Column("started_at", sa.BigInteger, nullable=True),
    sa.Column("finished_at", sa.BigInteger, nullable=True),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_runtime_seconds", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("idle_timeout", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("queued_at", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("kill_requested", sa.Integer, nullable=False, server_default="0"),
    sa.Column("kill_delivered_at", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("kind", sa.Text, nullable=False, server_default="job"),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    sa.Column("stdio", sa.Text, nullable=False, server_default=""),
    #: How many devices the job needs on one host.
    sa.Column("device_count", sa.Integer, nullable=False, server_default="1"),
    #: 1 once the retention pass deleted the job's stored output.
    sa.Column("logs_pruned", sa.Integer, nullable=False, server_default="0"),
    #: A several-device job's devices, comma-separated (IDs hold no comma, EXT-LIMITS-2); '' for
    #: one.
    sa.Column("device_ids", sa.Text, nullable=False, server_default=""),
    #: The name the job's submitter limit counts it under.
    sa.Column("share_name", sa.Text, nullable=False, server_default=""),
    #: The jobs it waits for, comma-separated; any end (1) or only ``succeeded`` (0); how many open.
    sa.Column("after_ids", sa.Text, nullable=False, server_default=""),
    sa.Column("after_any", sa.Integer, nullable=False, server_default="0"),
    sa.Column("after_open", sa.Integer, nullable=False, server_default="0"),
    #: What the worker measured of the job's GPUs, NULL when nothing was sampled.
    sa.Column("gpu_util_mean", sa.Float, nullable=True),
    sa.Column("gpu_mem_peak_bytes", sa.BigInteger, nullable=True),
    sa.Column("gpu_samples", sa.Integer, nullable=True),
    #: Migration 0014. The attempt running or last run (1 first); retries allowed and on what;
    #: how many attempts preemption ended (counted apart from retries); the devices the latest
    #: attempt ended on, avoided while another fits; 1 when the submit named its devices (a
    #: requeue keeps them, and clears any other job's).
    sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
    sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
    sa.Column("retry_on", sa.Text, nullable=False, server_default="lost"),
    sa.Column("preemptions", sa.Integer, nullable=False, server_default="0"),
    sa.Column("avoid_device_ids", sa.Text, nullable=False, server_default=""),
    sa.Column("pinned", sa.Integer, nullable=False, server_default="0"),
    #: The array the job is a task of ('' for none) and its index in it.
    sa.Column("array_id", sa.Text, nullable=False, server_default=""),
    sa.Column("array_index", sa.Integer, nullable=True),
    #: May be stopped to make room; ends ``killed`` instead of queueing again; its own grace
    #: (0: the controller's); the job its current attempt was chosen to make room for.
    sa.Column("preemptible", sa.Integer, nullable=False, server_default="0"),
    sa.Column("no_requeue", sa.Integer, nullable=False, server_default="0"),
    sa.Column("preempt_grace_seconds", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("preempted_by", sa.Text, nullable=False, server_default=""),
)

#: An array of tasks submitted in one request (EXT-ARRAY-1); ``max_running`` 0 is no cap.
arrays = sa.Table(
    "arrays",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("max_running", sa.Integer, nullable=False, server_default="0"),
    sa.Column("submitter", sa.Text, nullable=False),
    sa.Column("submitted_at", sa.BigInteger, nullable=False),
)

#: Every attempt that ended and sent its job back to the queue (EXT-RETRY-1, EXT-PREEMPT-2).
job_attempts = sa.Table(
    "job_attempts",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),
    sa.Column("device_ids", sa.Text, nullable=False, server_default=""),
    sa.Column("worker_id", sa.Text, nullable=False, server_default=""),
    sa.Column("started_at", sa.BigInteger, nullable=True),
    sa.Column("ended_at", sa.BigInteger, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("kill_reason", sa.Text, nullable=False, server_default=""),
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("device_id", sa.Text, nullable=False),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("job_id", sa.Text, nullable=False, server_default=""),
    sa.Column("acquired_at", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.BigInteger, nullable=False),
    sa.Column("released_at", sa.BigInteger, nullable=True),
    sa.Column("kind", sa.Text, nullable=False, server_default="job"),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    #: Fencing token, strictly increasing across every lease ever granted.
    sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
)

reservations = sa.Table(
    "reservations",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("created_at", sa.BigInteger, nullable=False),
)

device_labels = sa.Table(
    "device_labels",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.BigInteger, nullable=False),
)

host_docs = sa.Table(
    "host_docs",
    metadata,
    sa.Column("host", sa.Text, primary_key=True),
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("updated_at", sa.BigInteger, nullable=False),
)

device_recoveries = sa.Table(
    "device_recoveries",
    metadata,
    sa.Column("device_id", sa.Text, nullable=False),
    sa.Column("at", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
)

#: Named monotonic counters (the lease epoch); a row per name.
counters = sa.Table(
    "counters",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

#: The ``fleet_version`` at which each device last changed for the pass (migration 0006's triggers).
device_changes = sa.Table(
    "device_changes",
    metadata,
    sa.Column("device_id", sa.Text, primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
)

#: Job output on PostgreSQL (EXT-PG-4, migration 0009): the head's length, the bytes the tail got.
job_logs = sa.Table(
    "job_logs",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("head_bytes", sa.BigInteger, nullable=False),
    sa.Column("tail_written", sa.BigInteger, nullable=False),
)

#: One chunk of a job's output: ``part`` 0 the head, 1 the tail; ``at`` its position in it.
log_chunks = sa.Table(
    "log_chunks",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("part", sa.SmallInteger, primary_key=True),
    sa.Column("at", sa.BigInteger, primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

#: A job and one it waits for; ``ended`` the state that one ended in (migration 0010's trigger).
job_after = sa.Table(
    "job_after",
    metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("after_id", sa.Text, primary_key=True),
    sa.Column("ended", sa.Text, nullable=False, server_default=""),
)

#: Devices held per share name (migration 0010's triggers on ``leases``); none held, no row.
share_held = sa.Table(
    "share_held",
    metadata,
    sa.Column("share_name", sa.Text, primary_key=True),
    sa.Column("devices", sa.BigInteger, nullable=False),
)

#: The usage rollup (EXT-ACCT-2, migration 0011): per group the running sums and latest hour.
usage_totals = sa.Table(
    "usage_totals",
    metadata,
    sa.Column("dim", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("last_hour", sa.BigInteger, nullable=False),
    sa.Column("jobs", sa.BigInteger, nullable=False),
    sa.Column("held_seconds", sa.BigInteger, nullable=False),
    sa.Column("sampled_seconds", sa.BigInteger, nullable=False),
    sa.Column("weighted_seconds", sa.Float, nullable=False),
    #: The mean GPU utilisation of the group's latest job that reported one.
    sa.Column("last_util", sa.Float, nullable=True),
    sqlite_with_rowid=False,
)

#: The same sums as they stood at the end of each hour the group was active.
usage_marks = sa.Table(
    "usage_marks",
    metadata,
    sa.Column("dim", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("hour", sa.BigInteger, primary_key=True),
    sa.Column("jobs", sa.BigInteger, nullable=False),
    sa.Column("held_seconds", sa.BigInteger, nullable=False),
    sa.Column("sampled_seconds", sa.BigInteger, nullable=False),
    sa.Column("weighted_seconds", sa.Float, nullable=False),
    sqlite_with_rowid=False,
)

#: The leadership lease (EXT-PG-8, migration 0013): holder, epoch, renewing session, lease end.
leadership = sa.Table(
    "leadership",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("holder", sa.Text, nullable=False, server_default=""),
    sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("backend", sa.Integer, nullable=False, server_default="0"),
    sa.Column("expires_at", sa.Float, nullable=False, server_default="0"),
)

sa.Index(
    "leases_one_live_per_device",
    leases.c.device_id,
    unique=True,
    sqlite_where=leases.c.released_at.is_(None),
    postgresql_where=leases.c.released_at.is_(None),
)
sa.Index(
    "jobs_idempotency",
    jobs.c.idempotency_key,
    unique=True,
    sqlite_where=jobs.c.idempotency_key.isnot(None),
    postgresql_where=jobs.c.idempotency_key.isnot(None),
)
sa.Index("reservations_device", reservations.c.device_id, unique=True)
sa.Index("jobs_queue", jobs.c.state, jobs.c.priority.desc(), jobs.c.queued_at, jobs.c.seq)
sa.Index("jobs_worker_state", jobs.c.worker_id, jobs.c.state)
sa.Index("jobs_device", jobs.c.device_id, jobs.c.submitted_at)
sa.Index("leases_job", leases.c.job_id)
sa.Index("jobs_log_retention", jobs.c.logs_pruned, jobs.c.finished_at)
sa.Index("device_labels_device", device_labels.c.device_id)
sa.Index("device_changes_version", device_changes.c.version)
sa.Index("devices_worker", devices.c.worker_id)  #: a heartbeat's statements (migration 0005)
sa.Index("job_after_target", job_after.c.after_id)
sa.Index(
    "job_after_ended",
    job_after.c.job_id,
    sqlite_where=sa.text("ended != ''"),
    postgresql_where=sa.text("ended != ''"),
)
sa.Index("usage_totals_recent", usage_totals.c.dim, usage_totals.c.last_hour)
sa.Index(
    "jobs_array",
    jobs.c.array_id,
    jobs.c.state,
    sqlite_where=sa.text("array_id != ''"),
    postgresql_where=sa.text("array_id != ''"),
)
sa.Index("device_recoveries_device_at", device_recoveries.c.device_id, device_recoveries.c.at)
