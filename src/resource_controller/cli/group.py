"""The ``rc`` click group: subcommands imported lazily, since ``rc run`` start-up is hot."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from resource_controller import errors
from resource_controller.cli import basics, common, exits, render, signals

#: name -> ("module:function", one-line help): listing commands imports none of them.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "resource_controller.cli.run:command",
        "Lease a device, run a command on it, stream output.",
    ),
    "hold": (
        "resource_controller.cli.hold:hold",
        "Lease a device for yourself until a TTL, rc release or Ctrl-C.",
    ),
    "kill": ("resource_controller.cli.jobs:kill", "Cancel a queued job or stop a running one."),
    "release": ("resource_controller.cli.jobs:release", "End a hold (or any job) early."),
    "attach": ("resource_controller.cli.jobs:attach", "Re-stream a job's output until it ends."),
    "logs": ("resource_controller.cli.jobs:logs", "Print a job's stored output; -f to follow."),
    "jobs": ("resource_controller.cli.jobs:jobs", "Search job history, including finished jobs."),
    "ps": ("resource_controller.cli.jobs:ps", "Active jobs, then the queue."),
    "devices": ("resource_controller.cli.devices:devices", "The fleet: state, holder, command."),
    "describe": ("resource_controller.cli.devices:describe", "Everything about one device."),
    "cp": ("resource_controller.cli.cp:cp", "Copy a file or tree to or from a device."),
    "clear": ("resource_controller.cli.devices:clear", "(admin) Return a quarantined device."),
    "retire": ("resource_controller.cli.devices:retire", "(admin) Remove a device; needs --yes."),
    "drain": (
        "resource_controller.cli.drain:drain",
        "(admin) Let devices finish their work, then take nothing new.",
    ),
    "undrain": ("resource_controller.cli.drain:undrain", "(admin) Let drained devices work again."),
    "serve": ("resource_controller.cli.serve:serve", "Run the controller."),
    "worker": ("resource_controller.cli.serve:worker", "Run the device-host agent."),
    "up": ("resource_controller.cli.serve:up", "Run a controller and a worker on this machine."),
    "usage": (
        "resource_controller.cli.usage:usage",
        "Who held the devices over a window, per submitter, device or host.",
    ),
    "whoami": ("resource_controller.cli.whoami:whoami", "Show this token's role and name."),
    "mcp": (
        "resource_controller.cli.mcp:mcp",
        "Serve the rc tools to an AI agent over MCP (stdio).",
    ),
}

CONTEXT_SETTINGS = common.CONTEXT_SETTINGS


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use from ``COMMANDS``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attr = target[0].partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise common.Failure(f"rc {cmd_name} is not available: {e}") from e
        command = getattr(module, attr)
        if not isinstance(command, click.Command):
            raise common.Failure(f"rc {cmd_name} is not available")
        # So rc help and shell completion cannot disagree.
        command.short_help = target[1]
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in sorted(COMMANDS)]
        rows += [(n, c.get_short_help_str()) for n, c in sorted(self.commands.items())]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if args and name not in COMMANDS and name not in self.commands:
            raise click.UsageError(f"unknown command {name!r} (see rc help)", ctx)
        return super().resolve_command(ctx, args)

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> NoReturn:
        try:
            rv = super().main(args, prog_name or "rc", complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            exits.leave(e.exit_code)
        except click.UsageError as e:
            exits.fail(exits.one_line(e.format_message()))
        except click.ClickException as e:
            exits.fail(exits.one_line(e.format_message()), e.exit_code)
        except click.Abort:
            exits.fail("interrupted")
        except (basics.Failure, signals.Interrupted, errors.RcError, OSError) as e:
            exits.failed(e)
        exits.leave(rv if isinstance(rv, int) else 0)


#: The end of ``rc help``: what every command shares (CLI §2), kept short.
EPILOG = """\b
Start with: rc run -- CMD (any free device), rc ps, rc devices, rc help run.

\b
Environment:
  RC_CONTROLLER  controller URL (else config, else http://localhost:8080)
  RC_TOKEN       bearer token (else config)
  RC_SUBMITTER   who you are to the queue (else config, else USER@host)
  RC_CONFIG      user config file (default ~/.config/rc/config.yaml)

\b
Exit status: 0 on success; rc run exits with the job's own code;
130 when interrupted (SIGINT or SIGTERM) where the command says so;
1 for any other failure, after one "rc: ..." line on stderr.

\b
Shell completion, e.g. in ~/.bashrc (zsh_source, fish_source alike):
  eval "$(_RC_COMPLETE=bash_source rc)"
"""


def installed_version() -> str:
    """The installed package's version, cheaply: see ``version``."""
    from resource_controller import version

    return version.installed_version()


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        render.out(f"rc {installed_version()}\n")
        ctx.exit(0)


@click.group(
    cls=LazyGroup,
    context_settings=CONTEXT_SETTINGS,
    no_args_is_help=False,
    help="Exclusive leases on shared hardware: run commands on devices, see the fleet.",
    epilog=EPILOG,
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print the installed version.",
)
def rc() -> None:
    """Entry group: subcommands do the work."""


@rc.command("version", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
def version_command() -> None:
    """Print the installed version.

    rc --version prints the same.
    """
    render.out(f"rc {installed_version()}\n")


@rc.command("help", cls=common.RcCommand, context_settings=CONTEXT_SETTINGS)
@click.argument("command", required=False)
@click.pass_context
def help_command(ctx: click.Context, command: str | None) -> None:
    """Show help for rc or one of its commands.

    The same page as rc COMMAND --help (or -h), on stdout.
    """
    group = ctx.parent.command if ctx.parent is not None else rc
    parent = ctx.parent or ctx
    if command is None:
        render.out(group.get_help(parent) + "\n")
        return
    assert isinstance(group, click.Group)
    sub = group.get_command(parent, command)
    if sub is None:
        raise click.UsageError(f"unknown command {command!r} (see rc help)")
    sub_ctx = sub.make_context(command, [], parent=parent, resilient_parsing=True)
    render.out(sub.get_help(sub_ctx) + "\n")
