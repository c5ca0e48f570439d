"""``rc serve``, ``rc worker``, ``rc up``; server imports stay inside the command bodies."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from resource_controller.cli import common

#: ``--log-format``; the same names as ``resource_controller.logfmt.FORMATS``.
log_format_option = click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines as readable text or as one JSON object per line.",
)


@click.command(cls=common.RcCommand)
@click.option("--addr", default=":8080", show_default=True, help="Listen address host:port.")
@click.option(
    "--data",
    default="/var/lib/rc",
    show_default=True,
    type=click.Path(path_type=Path),
    help="State directory (database, job logs).",
)
@click.option(
    "--database",
    default="",
    envvar="RC_DATABASE",
    metavar="URL",
    help="A postgresql:// URL to keep the state in, shared by several controllers"
    " (RC_DATABASE). Default: the SQLite file rc.db in --data.",
)
@click.option(
    "--retain-disconnected-jobs",
    is_flag=True,
    help="Keep active jobs while their worker is silent instead of marking them lost.",
)
@click.option(
    "--webhook-url",
    default="",
    help="URL to POST operational events to (watchdog_trip, verify_failed, device_unhealthy, "
    "worker_lost, device_recovered, job_lost, lease_expired, job.preempted); empty:"
    " RC_WEBHOOK_URL.",
)
@click.option(
    "--priority-aging",
    type=common.DurationType("0, the default, means no aging"),
    default=0.0,
    metavar="DURATION",
    help="Raise a queued job's priority by one per DURATION waited, up to the top of the"
    " range (10), so low priorities are not starved. Default: off.",
)
@click.option(
    "--log-retention",
    type=common.DurationType("0, the default, keeps output for ever"),
    default=0.0,
    metavar="DURATION",
    help="Delete the stored output of jobs that ended longer ago than DURATION (the jobs"
    " themselves stay in the history). Default: kept.",
)
@click.option(
    "--max-log-bytes",
    type=common.SIZE,
    default="256MiB",
    show_default=True,
    metavar="SIZE",
    help="Cap on one job's stored output (bytes, or KiB/MiB/GiB; 0: no cap). Past it the"
    " first half of the cap and the last bytes are kept, with a line saying how many bytes"
    " were dropped between them; followers get the part past the first half when the job"
    " ends. At least 4KiB.",
)
@click.option(
    "--max-devices-per-submitter",
    type=common.INT,
    default=None,
    metavar="N",
    help="Let each submitter hold at most N devices at once (holds and every device of a"
    " gang count); a submitter at the limit queues while other people's jobs are placed."
    " Default: no limit.",
)
@click.option(
    "--limits",
    "limits_file",
    default="",
    metavar="FILE",
    help='Per-name limits, a YAML file: "limits:" then "alice: 4" lines, "*" for everyone'
    " else (in place of --max-devices-per-submitter). Read again on SIGHUP.",
)
@click.option(
    "--preemption",
    type=click.Choice(["on", "off"]),
    default="on",
    show_default=True,
    help="Let a waiting job stop preemptible jobs (rc run --preemptible) to make room.",
)
@click.option(
    "--preempt-min-runtime",
    type=common.DurationType("0 lets a job be stopped at once"),
    default=60.0,
    metavar="DURATION",
    help="Never stop a preemptible job in its first DURATION. Default: 60s.",
)
@click.option(
    "--preempt-grace",
    type=common.DurationType("0 sends SIGKILL with the SIGTERM"),
    default=30.0,
    metavar="DURATION",
    help="From a victim's SIGTERM to its SIGKILL; its own --preempt-grace may shorten it."
    " Default: 30s.",
)
@log_format_option
@click.argument("stray", nargs=-1, required=False)
def serve(
    addr: str,
    data: Path,
    database: str,
    retain_disconnected_jobs: bool,
    webhook_url: str,
    priority_aging: float,
    log_retention: float,
    max_log_bytes: int,
    max_devices_per_submitter: int | None,
    limits_file: str,
    preemption: str,
    preempt_min_runtime: float,
    preempt_grace: float,
    log_format: str,
    stray: tuple[str, ...],
) -> None:
    """Run the controller.

    RC_TOKENS (required) lists the tokens it accepts, comma-separated, each
    token:role or token:role:name, the role being worker, client or admin; a bad
    entry stops it before it binds (exit 1). RC_WEBHOOK_URL is used when
    --webhook-url is empty. Everything it keeps is under --data: the SQLite database
    rc.db and one log file per job in logs/; with --database, the state is in that
    PostgreSQL database instead.

    It speaks plain HTTP: put TLS in front of it (a reverse proxy). GET /healthz
    answers without a token. SIGINT or SIGTERM stops it gracefully (exit 0).
    """
    from resource_controller.controller import serve as controller

    try:
        policy = controller.policy(
            priority_aging,
            log_retention,
            max_log_bytes,
            max_devices_per_submitter,
            preemption,
            preempt_min_runtime,
            preempt_grace,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(
        controller.run(
            addr,
            data,
            retain_disconnected_jobs,
            webhook_url,
            log_format,
            database=database,
            limits_file=limits_file,
            **policy,
        )
    )


@click.command(cls=common.RcCommand)
@click.option(
    "-c",
    "--config",
    "config_path",
    default="/etc/rc/worker.yaml",
    show_default=True,
    help="Worker config file.",
)
@log_format_option
@click.argument("stray", nargs=-1, required=False)
def worker(config_path: str, log_format: str, stray: tuple[str, ...]) -> None:
    """Run the device-host agent.

    The config file (YAML) names the controller, the token and the devices; an
    unknown key or a bad value is an error naming it (exit 1). RC_TOKEN supplies the
    worker token when the file has none; RC_REQUIRE_MANUAL_CLEAR can only switch
    require_manual_clear on. The worker only dials out to the controller.

    SIGINT or SIGTERM stops it gracefully: it stops its jobs (SIGTERM, then SIGKILL
    after 10 s), waits up to 45 s for their reports and runs pending release hooks,
    then exits 0. A second signal ends it at once.
    """
    from resource_controller.worker import process

    sys.exit(process.main(config_path, log_format))


#: About 15,000 ``slotN`` fit one 1 MiB registration body; the rest is room for host
#: names and labels (``tests/cli/test_up_devices.py`` checks it fits).
UP_DEVICES = (1, 10_000)


def check_up_devices(count: int) -> None:
    """Before start-up: either bound would otherwise fail only after it."""
    low, high = UP_DEVICES
    if not low <= count <= high:
        raise click.UsageError(f"--devices must be in {low}..{high}, got {count}")


@click.command(cls=common.RcCommand)
@click.option(
    "--data",
    type=click.Path(path_type=Path),
    default=None,
    help="State directory (default $XDG_DATA_HOME/rc, else ~/.local/share/rc).",
)
@click.option("--addr", default="127.0.0.1:8080", show_default=True, help="Listen address.")
@click.option(
    "--devices",
    default=2,
    show_default=True,
    type=common.INT,
    help=f"How many generic devices (slot0..) when nvidia-smi lists no GPU:"
    f" {UP_DEVICES[0]}..{UP_DEVICES[1]}.",
)
@click.option("--force", is_flag=True, help="Overwrite controller/token in the user config file.")
@log_format_option
def up(data: Path | None, addr: str, devices: int, force: bool, log_format: str) -> None:
    """Run a controller and a worker for this machine, with nothing to configure.

    On first start it generates the tokens and writes the controller URL and a
    client token to the user config file (~/.config/rc/config.yaml, or RC_CONFIG),
    so that rc run -- CMD works from another shell. The admin token is printed once
    and kept in the data directory. Ctrl-C stops the worker, then the controller.
    """
    check_up_devices(devices)
    from resource_controller import local

    sys.exit(local.run(data, addr, devices, force, log_format))
