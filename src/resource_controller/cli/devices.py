"""Device commands; ``--select`` asks the controller's explain route so it cannot disagree with a submit."""

from __future__ import annotations

from typing import Any

import click

from resource_controller.cli import common, render
from resource_controller.cli.common import CONTEXT_SETTINGS
from resource_controller.client import api
from resource_controller.core import durations
from resource_controller.core.mig import CONFLICT as MIG_CONFLICT

#: A heartbeat older than this earns "no contact".
NO_CONTACT_AFTER = 30


@click.command(
    "devices",
    cls=common.RcCommand,
    context_settings={**CONTEXT_SETTINGS, "allow_extra_args": True},
)
@click.option("--select", "selector", default="", metavar="SELECTOR", help="Selector filter.")
@click.option(
    "-o",
    "--output",
    default="text",
    is_flag=False,
    flag_value="json",
    metavar="[text|json]",
    help="text or json; a bare -o means json.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as -o json.")
def devices(selector: str, output: str, as_json: bool) -> None:
    """The fleet: each device's state, holder, lease age and command.

    --select keeps the devices the selector matches, as the controller matches them
    for a submit. States: ready, busy, unknown (no contact for 30 s), unhealthy (out
    of the pool until proven clean or cleared by an admin).
    """
    # -o takes a value; a bare -o (the base switch) and --json mean json.
    fmt = common.output_format(output)
    if as_json:
        fmt = "json"
    client = api.JsonClient()
    views: list[api.Json] = list(client.state().get("devices") or [])
    if selector:
        explained = client.explain(selector)
        matching = set(explained.get("matching") or [])
        views = [v for v in views if _device(v).get("id") in matching]
        hint = explained.get("hint")
        if not matching and isinstance(hint, str) and hint:
            render.say(f"no device matches: {hint}")  # stderr: stdout stays the table
    if fmt == "json":
        render.out(render.json_indented(views))
        return
    rows = [["DEVICE", "STATE", "HOLDER", "ELAPSED", "COMMAND"]]
    rows.extend(_device_row(view) for view in views)
    render.out(render.table(rows))


def _device(view: api.Json) -> api.Json:
    device = view.get("device")
    return device if isinstance(device, dict) else {}


def _device_row(view: api.Json) -> list[str]:
    device = _device(view)
    state = str(device.get("state") or "")
    heartbeat_age = view.get("heartbeat_age_seconds")
    if isinstance(heartbeat_age, int) and heartbeat_age > NO_CONTACT_AFTER:
        state += f" (no contact {durations.compact(heartbeat_age)})"
    if device.get("draining"):
        state += " (draining)"
    if mig_conflict(device.get("labels")):
        state += " (mig conflict)"
    leased = bool(view.get("job_id") or view.get("holder"))
    holder = str(view.get("holder") or "")
    if holder and view.get("reason"):
        holder += f" ({view['reason']})"
    elapsed = view.get("elapsed_seconds")
    return [
        str(device.get("id") or ""),
        state,
        holder or "-",
        durations.compact(elapsed) if leased and isinstance(elapsed, int) else "-",
        render.command_text(view.get("command")) or "-",
    ]


@click.command("describe", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("device_id")
@click.option("-o", "--output", default="text", help="text or json.")
def describe(device_id: str, output: str) -> None:
    """Everything about one device: holder, labels with their ages, usage sheet, recent jobs.

    For a device out of the pool it says why first, and lists its recent automatic
    recoveries.
    """
    fmt = common.output_format(output)
    data = api.JsonClient().describe(device_id)
    if fmt == "json":
        render.out(render.json_indented(data))
        return
    from resource_controller.cli import timefmt

    blocks = [
        _header_block(data),
        _labels_block(data),
        _sheet_block(data),
        _recent_block(data, timefmt),
    ]
    render.out("\n".join(render.table(block) for block in blocks))


def _header_block(data: api.Json) -> list[list[str]]:
    """CLI-154 header: device and state, who holds it, heartbeat, why it is out."""
    device = _device(data)
    rows = [[str(device.get("id") or ""), str(device.get("state") or "")]]
    if device.get("draining"):
        reason = device.get("drain_reason") or "no reason given"
        rows.append(["  draining", f"{reason}, by {device.get('drained_by') or 'unknown'}"])
    conflict = mig_conflict(data.get("labels") or device.get("labels"))
    if conflict:
        rows.append(["  MIG conflict", f"{conflict}; not offered"])
    if data.get("holder") or data.get("job_id"):
        elapsed = data.get("elapsed_seconds")
        running = durations.compact(elapsed if isinstance(elapsed, int) else 0)
        rows.append(
            [
                f"  held by {data.get('holder') or ''}",
                f"job {data.get('job_id')}{_with_devices(data)}, running {running}",
            ]
        )
    else:
        rows.append(["  free"])
    rows.append(["  heartbeat", durations.age(_int_or_none(data.get("heartbeat_age_seconds")))])
    if data.get("quarantine_reason"):
        rows.append(["  out of the pool", str(data["quarantine_reason"])])
    rows.extend(_recoveries_rows(data.get("recoveries")))
    return rows


def mig_conflict(labels: Any) -> str:
    """Why the name conflicts with the GPU's MIG mode; ``""`` when it does not."""
    for label in labels if isinstance(labels, list) else []:
        if isinstance(label, dict) and label.get("key") == MIG_CONFLICT:
            return str(label.get("value") or "")
    return ""


def _with_devices(data: api.Json) -> str:
    """Only for several devices, so a one-device job keeps the base line."""
    for job in data.get("recent_jobs") or []:
        if isinstance(job, dict) and job.get("id") == data.get("job_id"):
            ids = job.get("device_ids")
            if isinstance(ids, list) and len(ids) > 1:
                return " on " + ",".join(str(i) for i in ids)
    return ""


def _recoveries_rows(history: Any) -> list[list[str]]:
    """The flap guard's view: automatic recoveries in the last hour."""
    if not isinstance(history, dict) or not history.get("recoveries"):
        return []
    done = history["recoveries"]
    left = history.get("remaining", 0)
    note = f"{len(done)} in the last hour, {left} left"
    if not left:
        note += " (the next quarantine waits for rc clear)"
    rows = [["  auto-recovered", note]]
    rows.extend(["", f"{r.get('at', '')} from {r.get('reason', '')}"] for r in done)
    return rows


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def label_order(label: api.Json) -> tuple[bytes, int]:
    """CLI-155: by key in byte order, then ``detected`` (and anything else) before ``declared``."""
    return (
        str(label.get("key", "")).encode("utf-8"),
        1 if label.get("source") == "declared" else 0,
    )


def _labels_block(data: api.Json) -> list[list[str]]:
    labels = data.get("labels")
    if labels is None:
        labels = _device(data).get("labels")
    ages = data.get("label_age_seconds") or {}
    rows = [["LABELS"]]
    for label in sorted(labels or [], key=label_order):
        key, source = label.get("key", ""), label.get("source", "")
        age = durations.age(_int_or_none(ages.get(f"{key}/{source}")))
        rows.append([f"  {key}={label.get('value', '')}", f"{source} {age}"])
    if len(rows) == 1:
        rows.append(["  (none)"])
    return rows


def _sheet_block(data: api.Json) -> list[list[str]]:
    rows = [["USAGE SHEET"]]
    sheet = data.get("sheet") or ""
    if not sheet:
        rows.append(["  (none on file)"])
        return rows
    scope = "host-wide note" if data.get("sheet_is_host_wide") else "device note"
    age = durations.age(_int_or_none(data.get("sheet_age_seconds")))
    rows.append([f"  {scope}, updated {age}"])
    rows.extend([f"  {line}"] for line in str(sheet).splitlines())
    return rows


def _recent_block(data: api.Json, timefmt: Any) -> list[list[str]]:
    rows = [["RECENT JOBS"]]
    recent = data.get("recent_jobs") or []
    if not recent:
        rows.append(["  (none)"])
        return rows
    now = timefmt.utc_now()
    # Without measured GPUs, CLI-154's base table.
    gpu = any(_gpu_cell(job) != "-" for job in recent)
    rows.append(["  JOB", "STATE", "DURATION", *(["GPU"] if gpu else []), "COMMAND"])
    for job in recent:
        started = timefmt.parse(job.get("started_at"))
        finished = timefmt.parse(job.get("finished_at"))
        duration = "-" if started is None else timefmt.compact_between(started, finished or now)
        state = str(job.get("state") or "")
        if job.get("kill_reason"):
            state += f" ({job['kill_reason']})"
        rows.append(
            [
                f"  {job.get('id', '')}",
                state,
                duration,
                *([_gpu_cell(job)] if gpu else []),
                render.command_text(job.get("command")),
            ]
        )
    return rows


def _gpu_cell(job: api.Json) -> str:
    """What a job's GPUs did, short: ``87% 20.0GiB``; ``-`` when nothing was measured."""
    parts = []
    util, peak = job.get("gpu_util_mean"), job.get("gpu_mem_peak_bytes")
    if isinstance(util, int | float) and not isinstance(util, bool):
        parts.append(f"{util:.0f}%")
    if isinstance(peak, int) and not isinstance(peak, bool):
        parts.append(f"{peak / (1 << 30):.1f}GiB")
    return " ".join(parts) or "-"


@click.command("clear", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("device_id")
def clear(device_id: str) -> None:
    """(admin) Return a quarantined device to the pool; asserts its hardware is healthy.

    Needs an admin token. Only an unhealthy device with no live lease can be
    cleared; anything else is device_not_cleared (exit 1). rc describe DEVICE_ID says
    why it was taken out.
    """
    api.JsonClient().device_action(device_id, "clear")
    render.out(f"cleared {device_id}\n")


@click.command("retire", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("device_id")
@click.option("--yes", is_flag=True, help="Confirm the removal.")
def retire(device_id: str, yes: bool) -> None:
    """(admin) Remove a device from the fleet; its job history is kept.

    Needs an admin token and --yes. A device something holds is device_busy: kill or
    release it first. A worker that still declares the device recreates it when it
    next registers.
    """
    if not yes:
        render.say(f"this removes {device_id} from the fleet; re-run with --yes to confirm")
        raise common.Failure("not confirmed")
    result = api.JsonClient().device_action(device_id, "")
    render.out(f"retired {result.get('retired') or device_id}\n")
    note = result.get("note")
    if note:
        render.say(f"note: {note}")
