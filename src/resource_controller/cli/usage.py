"""``rc usage``: flags are checked first so a bad ``--since`` gets examples, not a 400."""

from __future__ import annotations

import click

from resource_controller.cli import common, render
from resource_controller.cli.common import CONTEXT_SETTINGS
from resource_controller.client import api
from resource_controller.core import usage as acct

_HEADS = {"submitter": "SUBMITTER", "device": "DEVICE", "host": "HOST"}


@click.command("usage", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.option(
    "--since",
    default=acct.DEFAULT_SINCE,
    metavar="DURATION",
    help="The window: the last DURATION (7d, 36h, 2w, 1d12h), from the start of its first hour.",
)
@click.option(
    "--by",
    default=acct.DEFAULT_BY,
    metavar="WHAT",
    help="One line per submitter (the default), device or host.",
)
@click.option("-o", "--output", default="text", help="text or json (one line).")
def usage(since: str, by: str, output: str) -> None:
    """Who held the devices over a window, largest first, from the controller's records.

    Per group: jobs that ended in the window, device-hours (time held × devices),
    GPU-hours weighted by each job's measured mean utilisation (- where no job
    measured one), and the group's share of the window's device-hours. The window
    starts on the hour; a job counts in the hour it ended. -o json prints the
    controller's answer on one line.
    """
    fmt = common.output_format(output)
    try:
        acct.parse_since(since)
        acct.check_by(by)
    except acct.UsageError as exc:
        raise click.UsageError(f"--{exc}") from None
    answer = api.JsonClient().usage(since, by)
    if fmt == "json":
        render.out(render.json_compact(answer))
        return
    render.out(text(answer))


def _hours(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _share(value: object) -> str:
    return f"{value * 100:.1f}%" if isinstance(value, int | float) else "-"


def _row(name: str, group: api.Json, share: str) -> list[str]:
    return [
        name,
        str(group.get("jobs", 0)),
        _hours(group.get("device_hours")),
        _hours(group.get("gpu_hours")),
        share,
    ]


def text(answer: api.Json) -> str:
    """The table: a line per group, then the total and the window."""
    by = str(answer.get("by") or "")
    groups = [g for g in answer.get("groups") or [] if isinstance(g, dict)]
    window = f"{answer.get('since', '?')} to {answer.get('until', '?')}"
    if not groups:
        return f"no device was held by a job that ended from {window}\n"
    rows = [[_HEADS.get(by, by.upper()), "JOBS", "DEVICE-HOURS", "GPU-HOURS", "SHARE"]]
    rows.extend(_row(str(g.get("group") or ""), g, _share(g.get("share"))) for g in groups)
    found = answer.get("total")
    rows.append(_row("(all)", found if isinstance(found, dict) else {}, "100.0%"))
    out = render.table(rows)
    more = answer.get("more")
    if isinstance(more, int) and more > 0:
        out += f"... and {more} smaller group(s), counted in (all)\n"
    return out + f"jobs that ended from {window}\n"
