"""``rc drain``/``rc undrain``: ``--host`` and ``--wait`` are done over ``/v1/state``, needing no route."""

from __future__ import annotations

from collections.abc import Sequence

import click

from resource_controller import errors
from resource_controller.cli import common, render, signals
from resource_controller.cli.common import CONTEXT_SETTINGS
from resource_controller.client import api, machine


def _targets(client: api.JsonClient, devices: Sequence[str], host: str) -> list[str]:
    """The device IDs named: as given, or every device of ``--host`` (one state read)."""
    if devices and host:
        raise click.UsageError("give device IDs or --host, not both")
    if not devices and not host:
        raise click.UsageError("name at least one device, or --host HOST")
    if devices:
        return list(dict.fromkeys(devices))
    views = client.state().get("devices") or []
    found = [
        str(v["device"].get("id") or "")
        for v in views
        if isinstance(v.get("device"), dict) and v["device"].get("host") == host
    ]
    if not found:
        raise common.Failure(f"no device is registered on host {host!r}")
    return found


def _held_text(view: api.Json) -> str:
    device = view.get("device") or {}
    who = view.get("holder") or "?"
    job = f", job {view['job_id']}" if view.get("job_id") else ""
    return f"{device.get('id', '')} (held by {who}{job})"


@click.command("drain", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("devices", nargs=-1, metavar="DEVICE...")
@click.option("--host", default="", metavar="HOST", help="Every device of this host.")
@click.option("--reason", default="", metavar="TEXT", help="Why (shown by rc describe).")
@click.option(
    "--wait", is_flag=True, help="Then block until no named device has a live lease (Ctrl-C stops)."
)
@common.as_option()
def drain(devices: tuple[str, ...], host: str, reason: str, wait: bool, as_: str) -> None:
    """(admin) Let devices finish what they run, then take nothing new.

    Jobs may still queue for a draining device; they start after rc undrain.
    """
    client = api.JsonClient(submitter=as_ or None)
    targets = _targets(client, devices, host)
    for device_id in targets:
        client.device_action(device_id, "drain", {"submitter": client.submitter, "reason": reason})
        render.out(f"draining {device_id}\n")
    if not wait:
        return

    def on_wait(held: list[api.Json]) -> None:
        render.say("waiting for " + "; ".join(_held_text(v) for v in held))

    try:
        client.wait_idle(targets, on_wait=on_wait)
    except signals.Interrupted:
        signals.restore_defaults()
        render.say("stopped waiting; the devices stay draining")
        raise SystemExit(machine.EXIT_INTERRUPTED) from None
    except errors.ClientError as e:
        raise common.Failure(str(e)) from e
    render.out("idle: " + ", ".join(targets) + "\n")


@click.command("undrain", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("devices", nargs=-1, metavar="DEVICE...")
@click.option("--host", default="", metavar="HOST", help="Every device of this host.")
def undrain(devices: tuple[str, ...], host: str) -> None:
    """(admin) Let draining devices take work again."""
    client = api.JsonClient()
    for device_id in _targets(client, devices, host):
        client.device_action(device_id, "undrain")
        render.out(f"undrained {device_id}\n")
