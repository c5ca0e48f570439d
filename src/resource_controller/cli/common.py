"""Shared command pieces; a boolean flag also takes ``--flag=false``, which click lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from resource_controller.cli import basics
from resource_controller.cli.basics import Failure as Failure
from resource_controller.client.machine import devices_text as devices_text

#: Every command answers -h as well as --help (CLI §1).
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


class RcCommand(click.Command):
    """A click command that also accepts ``--flag=true|false`` for boolean flags."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _explicit_booleans(self, ctx, args))


def _explicit_booleans(command: click.Command, ctx: click.Context, args: list[str]) -> list[str]:
    """Rewrite ``--flag=true|false`` into forms click understands; option values and words after ``--`` are left alone."""
    flags: dict[str, click.Option] = {}
    takes_value: set[str] = set()
    optional_value: set[str] = set()
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            names = param.opts + param.secondary_opts
            if param.is_flag:
                flags.update(dict.fromkeys(names, param))
            else:
                takes_value.update(names)
                if getattr(param, "_flag_needs_value", False):
                    optional_value.update(names)
    out: list[str] = []
    skip_next = False
    for i, arg in enumerate(args):
        if skip_next:
            skip_next = False
            if not (arg[:1] == "-" and len(arg) > 1 and args[i - 1] in optional_value):
                out.append(arg)
                continue
        if arg == "--":
            out.extend(args[i:])
            break
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            if name in flags:
                flag = flags[name]
                negative = name in flag.secondary_opts
                if value not in basics.TRUE | basics.FALSE:
                    raise click.UsageError(f"invalid boolean value {value!r} for {name}", ctx)
                if (value in basics.TRUE) != negative:
                    out.append(flag.opts[0])
                elif flag.secondary_opts:
                    out.append(flag.secondary_opts[0])
                continue
        elif arg in takes_value and (arg.startswith("--") or len(arg) == 2):
            skip_next = True
        out.append(arg)
    return out


_F = TypeVar("_F", bound=Callable[..., Any])

if TYPE_CHECKING:
    _DurationBase = click.ParamType[float, Any]
    _IntBase = click.ParamType[int, Any]
else:  # click < 8.3 has no type parameters on ParamType
    _DurationBase = _IntBase = click.ParamType


class DurationType(_DurationBase):
    """A duration flag, converted to seconds as a float; never negative."""

    name = "duration"

    def __init__(self, negative_hint: str = "0 means none") -> None:
        #: What a negative value is told instead (``--ttl`` has no "none").
        self.negative_hint = negative_hint

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            return basics.parse_duration(str(value), self.negative_hint)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class IntType(_IntBase):
    """An integer flag: decimal, with ``0x``/``0o`` prefixes tolerated."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        number = basics.parse_int(text)
        if number is None:
            self.fail(f"invalid integer {text!r}", param, ctx)
        return number


class SizeType(_IntBase):
    """A byte-size flag (``--max-log-bytes``): ``1048576``, ``64KiB``, ``256MiB``."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from resource_controller.core import sizes

        try:
            return sizes.parse_size(str(value))
        except sizes.SizeError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
INT = IntType()
SIZE = SizeType()


def output_format(value: str) -> str:
    """Validate an ``-o`` value before any request: text or json."""
    lowered = value.lower()
    if lowered not in ("text", "json"):
        raise Failure(f'unknown output format "{value}" (want "text" or "json")')
    return lowered


def check_job_state(state: str) -> None:
    """Refused before any request."""
    from resource_controller.core.states import JobState

    valid = [s.value for s in JobState]
    if state not in valid:
        raise click.UsageError(f"unknown state {state!r} (valid states: {', '.join(valid)})")


def as_option() -> Callable[[_F], _F]:
    return click.option(
        "--as", "as_", default="", metavar="ID", help="Submitter identity (default: derived)."
    )
