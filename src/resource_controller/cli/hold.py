"""``rc hold``: lease a device for a person, no command, until TTL, release or Ctrl-C (CLI §5).

The command is a shorter cousin of ``rc run``'s state machine (CLI §4.3)::

    SUBMIT -> [WAIT_QUEUE] -> GRANTED -> WAIT_TERMINAL -> EXIT 0

The queue step is ``rc run``'s own (``run.wait_queue``, ``run.cancel``): the same
position lines, and an interrupt there CANCELs the queued hold. Once
granted the meaning of an interrupt is the opposite of ``rc run``'s: a hold exists
because a person is present, so leaving means done and ``rc`` RELEASEs it
instead of detaching. Either way the first signal already restored the default
handlers (``signals``), so a second Ctrl-C during the cancel or release request
kills ``rc`` at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import click

from resource_controller import errors
from resource_controller.cli import basics, common, render, run, signals, timefmt
from resource_controller.cli.common import CONTEXT_SETTINGS
from resource_controller.client import api

#: ``--ttl``: a duration whose negative is refused; 0 is refused too, as a
#: hold for no time, and leaving it out as missing.
TTL = common.DurationType(negative_hint="a hold needs a positive TTL")


@dataclass(frozen=True)
class HoldRequest:
    """What the user asked ``rc hold`` for, validated and converted to wire units."""

    ttl_seconds: int
    reason: str
    device: str = ""
    selector: str = ""
    #: Several devices on one host, by count or by a list of IDs.
    count: int = 1
    device_ids: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        """What the user gave to pick a device, verbatim (``<target>``)."""
        return ",".join(self.device_ids) or self.device or self.selector or "any device"


@dataclass
class _Progress:
    """How far the hold got; decides what an interrupt means."""

    phase: str = "submit"
    hold_id: str = ""


def expires_around(job: api.Json, ttl_seconds: int, now: datetime | None = None) -> str:
    """The granted line's expiry: ``started_at + ttl`` in UTC with ``Z``.

    Without a ``started_at`` yet, local now plus the TTL, written with the local UTC
    offset (so it cannot be mistaken for the controller's clock).
    """
    ttl = timedelta(seconds=ttl_seconds)
    started = timefmt.parse(job.get("started_at"))
    if started is not None:
        return timefmt.rfc3339(started + ttl)
    local = (now or datetime.now().astimezone()) + ttl
    return local.isoformat(timespec="seconds")


def hold_device(client: api.JsonClient, req: HoldRequest) -> int:
    """Carry out ``rc hold`` and return its exit code; failures raise ``common.Failure``."""
    progress = _Progress()
    try:
        return _hold(client, req, progress)
    except signals.Interrupted:
        if progress.phase == "queue":
            run.cancel(client, progress.hold_id)  # Exactly as CLI-109
            return run.EXIT_INTERRUPTED
        if progress.phase == "granted":
            release(client, progress.hold_id)
            return run.EXIT_INTERRUPTED
        raise  # during the submit: an ordinary failure (exit 1), as for rc run


def _hold(client: api.JsonClient, req: HoldRequest, progress: _Progress) -> int:
    job = client.hold(
        ttl_seconds=req.ttl_seconds,
        reason=req.reason,
        device=req.device,
        selector=req.selector,
        count=req.count,
        device_ids=req.device_ids,
    )
    progress.hold_id = hold_id = str(job.get("id", ""))
    if job.get("state") == "queued":
        progress.phase = "queue"
        job = run.wait_queue(client, hold_id, req.target, kind="hold")
    state = job.get("state")
    if state in api.TERMINAL_STATES:
        reason = job.get("kill_reason") or run.NO_DETAIL
        if not job.get("started_at"):
            device = common.devices_text(job) or req.target
            raise common.Failure(f"hold {hold_id} {state}, never granted on {device}: {reason}")
        raise common.Failure(f"hold {hold_id} is already {state}: {reason}")
    progress.phase = "granted"
    device = common.devices_text(job)
    render.say(
        f"hold {hold_id} granted on {device}, expires around {expires_around(job, req.ttl_seconds)}"
    )
    render.say(f"(end it early with rc release {hold_id}, or press Ctrl-C here)")
    try:
        final = client.wait_until_terminal(hold_id)  # No overall bound
    except errors.ClientError as e:
        # A lost controller is no reason to free a device a person is using.
        raise common.Failure(
            f"{e}; hold {hold_id} was not released and still ends at its TTL"
        ) from e
    render.say(f"hold {hold_id} ended: {final.get('kill_reason') or final.get('state')}")
    return 0


def release(client: api.JsonClient, hold_id: str) -> None:
    """RELEASE: end the hold with the resolved submitter, bounded; say how it went.

    The first signal restored default handling already; done again here so that the
    request can never run with the handler installed.
    """
    signals.restore_defaults()
    try:
        client.kill(hold_id, timeout=run.CANCEL_BOUND)
    except errors.NotCancellableError as e:
        render.say(f"could not release hold {hold_id}: not_cancellable: {e}")
    except errors.ClientError as e:
        render.say(f"could not release hold {hold_id}: {e}")
    else:
        render.say(f"released hold {hold_id}")


@click.command(
    "hold",
    cls=common.RcCommand,
    context_settings=CONTEXT_SETTINGS,
    short_help="Lease a device for yourself until a TTL, rc release or Ctrl-C.",
)
@click.argument("devices", nargs=-1, metavar="[DEVICE]")
@click.option(
    "--select", "selector", default="", metavar="SELECTOR", help="Label selector (not with DEVICE)."
)
@click.option(
    "--count",
    type=common.INT,
    default=1,
    metavar="N",
    help="Devices wanted on one host, all at once (every one must match --select).",
)
@click.option(
    "--ttl",
    type=TTL,
    default=None,
    metavar="DURATION",
    help="Required: how long to hold it (e.g. 30m, 1h30m); at most the device's max_runtime.",
)
@click.option(
    "--reason",
    default="",
    metavar="TEXT",
    help="Required: why; shown by rc devices and the dashboard.",
)
@common.as_option()
def hold(
    devices: tuple[str, ...], selector: str, count: int, ttl: float | None, reason: str, as_: str
) -> None:
    """Lease a device for a person, with no command, until the TTL, rc release, or Ctrl-C.

    DEVICE is an exact device ID (host:name), or a comma list of IDs on one host;
    --select picks one by labels; with neither, any device will do. --count N holds N
    devices of one host at once. rc hold waits in the queue while the device is busy,
    then prints the hold's ID, the device and when the hold expires, and keeps the
    device until the TTL passes or the hold is released.

    Ctrl-C while queued cancels the request; Ctrl-C once granted releases the hold.
    Both exit 130. A hold that ends by itself (TTL) or is released from elsewhere
    (rc release ID) prints why and exits 0.

    \b
    Examples:
      rc hold box:gpu0 --ttl 30m --reason "manual profiling"
      rc hold --select 'vram>=80G' --ttl 2h --reason "debugging a hang"
      rc hold --ttl 1h --reason "trying a driver"      (any device)
    """
    # CLI-120, in order, with no request before a failing check.
    if len(devices) > 1:
        raise click.UsageError(f"rc hold takes at most one device, got {len(devices)}")
    device = devices[0] if devices else ""
    if device and selector:
        raise click.UsageError("a DEVICE and --select cannot be used together")
    wanted = common.gang(device, count, "DEVICE")
    # Neither: any device.
    if not reason.strip():
        raise click.UsageError("--reason is required: say why you hold the device")
    if ttl is None:
        raise click.UsageError("--ttl is required: how long to hold the device (e.g. --ttl 30m)")
    if ttl <= 0:
        raise click.UsageError(
            f"--ttl must be in 1s..{basics.MAX_CEILING_TEXT}, got 0: a hold for no time"
            " holds nothing (e.g. --ttl 30m)"
        )
    common.check_ceiling("--ttl", ttl)  # CLI-073, EXT-LIMITS-1
    req = HoldRequest(
        ttl_seconds=common.whole_seconds(ttl),
        reason=reason,
        device=wanted.device,
        selector=selector,
        count=wanted.count,
        device_ids=wanted.device_ids,
    )
    client = api.JsonClient(submitter=as_ or None)  # resolved once, on first use
    if as_:
        from resource_controller.cli.whoami import warn_if_replaced

        warn_if_replaced(client, as_)  # EXT-WHO-4
    code = hold_device(client, req)
    if code:
        raise SystemExit(code)
