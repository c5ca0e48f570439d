"""``rc whoami``, and the ``rc run --as`` notice for a named client token."""

from __future__ import annotations

import click

from resource_controller import errors
from resource_controller.cli import common, render
from resource_controller.cli.common import CONTEXT_SETTINGS
from resource_controller.client import api
from resource_controller.core import identity
from resource_controller.core.states import Role


@click.command("whoami", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
def whoami() -> None:
    """Show the role of this token, and its name when it has one.

    A named client token records its jobs under its name and may end only those.
    """
    data = api.JsonClient().whoami()
    lines = [f"role: {data.get('role', '')}\n"]
    if data.get("name"):
        lines.append(f"name: {data['name']}\n")
    render.out("".join(lines))


def warn_if_replaced(client: api.JsonClient, submitter: str) -> None:
    """Asked only with ``--as``, so a plain ``rc run`` costs no request; failures are left to the submit."""
    try:
        data = client.whoami()
    except errors.ClientError:
        return
    name = data.get("name")
    if data.get("role") != "client" or not isinstance(name, str) or not name:
        return
    caller = identity.Caller(Role.CLIENT, name)
    recorded = identity.recorded_submitter(caller, submitter)
    if recorded != submitter:
        render.say(
            f"--as {submitter!r} is recorded as {recorded!r}: this client token is named "
            f"{name!r} and owns only that name (and {name}@..., {name}/...)"
        )
