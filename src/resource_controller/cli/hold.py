"""``rc hold`` (CLI §5), built from ``client.machine``.

Once granted, an interrupt RELEASEs instead of detaching: a hold exists because a
person is present, so leaving means done.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import click

from resource_controller import errors
from resource_controller.cli import basics, common, render, timefmt
from resource_controller.cli.common import CONTEXT_SETTINGS
from resource_controller.client import api, calls, machine, waits
from resource_controller.client import submit as spec
from resource_controller.client.calls import Json, Note
from resource_controller.core.states import TERMINAL

if TYPE_CHECKING:
    from resource_controller.client.calls import Op

#: ``--ttl``: negative, 0 (a hold for no time) and missing are all refused.
TTL = common.DurationType(negative_hint="a hold needs a positive TTL")
#: The flag names its refusals use: the device is ``rc hold``'s positional.
NAMES = {**spec.CLI, "device": "DEVICE"}


def expires_around(job: Json, ttl_seconds: int, now: datetime | None = None) -> str:
    """Without ``started_at``, local time with its UTC offset, so it is not taken for the controller's clock."""
    ttl = timedelta(seconds=ttl_seconds)
    started = timefmt.parse(job.get("started_at"))
    if started is not None:
        return timefmt.rfc3339(started + ttl)
    local = (now or datetime.now().astimezone()) + ttl
    return local.isoformat(timespec="seconds")


def held(wanted: spec.Submit, submitter: str, now: Callable[[], float]) -> Op[machine.RunEnd]:
    """``rc hold``'s run: its outcome (exit 0 once the hold ended on its own)."""
    job = yield from machine.submit(wanted, submitter, now)
    hold_id = str(job.get("id", ""))
    if job.get("state") == "queued":
        left = yield from machine.queue(hold_id, wanted.target, submitter, now, kind="hold")
        if isinstance(left, machine.RunEnd):
            return left
        job = left
    refused = yield from machine.placed(wanted, submitter, job)
    if refused is not None:
        return refused
    if job.get("state") in TERMINAL:
        reason = job.get("kill_reason") or machine.NO_DETAIL
        return machine.RunEnd(1, job, f"hold {hold_id} is already {job.get('state')}: {reason}")
    expiry = expires_around(job, wanted.max_runtime_seconds)
    yield Note(f"hold {hold_id} granted on {machine.devices_text(job)}, expires around {expiry}")
    yield Note(f"(end it early with rc release {hold_id}, or press Ctrl-C here)")
    wait = waits.Wait(hold_id, terminal=True, now=now(), quiet=machine.FINAL_WAIT)
    try:
        final = (yield from waits.until(wait, now)).job  # no overall bound
    except errors.ClientError as e:
        # A lost controller is no reason to free a device a person is using.
        message = f"{e}; hold {hold_id} was not released and still ends at its TTL"
        return machine.RunEnd(1, job, message)
    except BaseException as e:
        if isinstance(e, Exception | GeneratorExit):
            raise
        yield from release(hold_id, submitter)
        return machine.RunEnd(machine.EXIT_INTERRUPTED, job, "", "interrupted", e)
    yield Note(f"hold {hold_id} ended: {final.get('kill_reason') or final.get('state')}")
    return machine.RunEnd(0, final)


def release(hold_id: str, submitter: str) -> Op[None]:
    """RELEASE: end the hold with the resolved submitter, bounded; say how it went."""
    try:
        yield calls.kill(hold_id, submitter, machine.CANCEL_BOUND)
    except errors.NotCancellableError as e:
        yield Note(f"could not release hold {hold_id}: not_cancellable: {e}")
    except errors.ClientError as e:
        yield Note(f"could not release hold {hold_id}: {e}")
    else:
        yield Note(f"released hold {hold_id}")


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
    try:
        spec.devices(device, selector, count, NAMES)  # neither: any device
    except spec.BadSubmit as e:
        raise click.UsageError(str(e)) from None
    if not reason.strip():
        raise click.UsageError("--reason is required: say why you hold the device")
    if ttl is None:
        raise click.UsageError("--ttl is required: how long to hold the device (e.g. --ttl 30m)")
    if ttl <= 0:
        raise click.UsageError(
            f"--ttl must be in 1s..{spec.MAX_CEILING_TEXT}, got 0: a hold for no time"
            " holds nothing (e.g. --ttl 30m)"
        )
    try:
        wanted = spec.hold(ttl, reason, NAMES, device=device, select=selector, count=count)
    except spec.BadSubmit as e:
        raise basics.Failure(str(e)) from None
    client = api.JsonClient(submitter=as_ or None)  # resolved once, on first use
    if as_:
        from resource_controller.cli.whoami import warn_if_replaced

        warn_if_replaced(client, as_)  # EXT-WHO-4
    done = client.drive(held(wanted, client.submitter, client.monotonic), say=render.say)
    if done.message:
        render.say(done.message)
    if done.code:
        raise SystemExit(done.code)
