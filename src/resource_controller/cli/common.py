"""Pieces every ``rc`` command shares: flag parsing rules, value types, the client.

Flags follow GNU conventions (CLI-001) as click parses them, with one addition click
lacks: a boolean flag accepts an explicit value (``--no-wait=false``). Durations and
integers are parsed to the spec's grammar (CLI-005, CLI-006), and a bad value is a
usage error that names its flag.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from resource_controller.core import durations

#: Every command answers -h as well as --help (CLI §1).
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})


class Failure(click.ClickException):
    """A command failed: ``rc: <message>`` on stderr and exit 1 (CLI-041)."""

    exit_code = 1


class RcCommand(click.Command):
    """A click command that also accepts ``--flag=true|false`` for boolean flags."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _explicit_booleans(self, ctx, args))


def _explicit_booleans(command: click.Command, ctx: click.Context, args: list[str]) -> list[str]:
    """Rewrite ``--flag=value`` for boolean flags into the form click understands.

    ``true`` becomes ``--flag``; ``false`` drops it (every boolean defaults to false),
    or becomes the flag's ``--no-`` form where it has one (``--here=false``). An
    argument that is the value of a preceding option, and everything after ``--``, is
    left alone; an option whose value may be omitted (``rc devices -o``) takes no
    flag-like word as its value, as click itself decides.
    """
    flags: dict[str, click.Option] = {}
    takes_value: set[str] = set()
    optional_value: set[str] = set()
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            if param.is_flag:
                flags.update((name, param) for name in param.opts)
                flags.update((name, param) for name in param.secondary_opts)
            else:
                takes_value.update(param.opts + param.secondary_opts)
                if getattr(param, "_flag_needs_value", False):
                    optional_value.update(param.opts + param.secondary_opts)
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
                if value not in _TRUE and value not in _FALSE:
                    raise click.UsageError(f"invalid boolean value {value!r} for {name}", ctx)
                if (value in _TRUE) != negative:
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
    """A duration flag (CLI-005), converted to seconds as a float; never negative (EXT-CLI-8)."""

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
            seconds = durations.parse_duration(str(value))
        except durations.DurationError:
            self.fail(f"invalid duration {value!r} (examples: 90s, 30m, 1h30m)", param, ctx)
        if seconds < 0:
            # EXT-CLI-8: a negative duration is a mistake, never "no limit" (0 is that).
            self.fail(f"duration {value!r} is negative ({self.negative_hint})", param, ctx)
        return seconds


_INT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|[0-9]+)")


class IntType(_IntBase):
    """An integer flag (CLI-006): decimal, with ``0x``/``0o`` prefixes tolerated."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value)
        if not _INT.fullmatch(text):
            self.fail(f"invalid integer {text!r}", param, ctx)
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if digits[:2].lower() in ("0x", "0o"):
            return sign * int(digits, 0)
        return sign * int(digits, 10)


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
    """Validate an ``-o`` value before any request (CLI-140, EXT-CLI-3): text or json."""
    lowered = value.lower()
    if lowered not in ("text", "json"):
        raise Failure(f'unknown output format "{value}" (want "text" or "json")')
    return lowered


def check_job_state(state: str) -> None:
    """``rc jobs --state``: an unknown state is refused before any request, listing the valid
    ones (EXT-CLI-8)."""
    from resource_controller.core.states import JobState

    valid = [s.value for s in JobState]
    if state not in valid:
        raise click.UsageError(f"unknown state {state!r} (valid states: {', '.join(valid)})")


def whole_seconds(seconds: float) -> int:
    """Durations go on the wire as whole seconds, truncated toward zero (CLI-073)."""
    return int(seconds)


def check_ceiling(flag: str, seconds: float) -> None:
    """Refuse a positive ceiling under one second, which would be sent as 0 (CLI-073)."""
    if 0 < seconds < 1:
        raise Failure(
            f"{flag} must be at least 1s: ceilings work at one-second granularity"
            " (a shorter one would be sent as 0, meaning no ceiling)"
        )


@dataclass(frozen=True)
class Gang:
    """The devices a ``-d``/DEVICE and ``--count`` ask for (EXT-GANG-1)."""

    device: str = ""  #: one exact device
    device_ids: tuple[str, ...] = ()  #: several exact devices on one host, ascending
    count: int = 1  #: devices wanted on one host

    @property
    def target(self) -> str:
        return ",".join(self.device_ids) or self.device


def gang(device: str, count: int, flag: str) -> Gang:
    """Check ``--count`` against a device or comma-separated list, before any request.

    A list is devices on one host (the part of an ID before its first ``:``), and
    implies the count: a ``--count`` other than its length is refused, as is a count
    above 1 with one named device or a count below 1.
    """
    if count < 1:
        raise click.UsageError(f"--count must be at least 1, got {count}")
    if "," not in device:
        if device and count != 1:
            raise click.UsageError(
                f"--count {count} with one device: name all {count} as a comma list in {flag}"
            )
        return Gang(device=device, count=count)
    ids = [d.strip() for d in device.split(",")]
    if any(not d for d in ids):
        raise click.UsageError(f"{flag} {device!r}: an empty device ID in the list")
    if len(set(ids)) != len(ids):
        raise click.UsageError(f"{flag} {device!r} names a device more than once")
    hosts = sorted({d.split(":", 1)[0] for d in ids})
    if len(hosts) > 1:
        raise click.UsageError(
            f"{flag} {device!r}: the devices must be on one host, not on {', '.join(hosts)}"
        )
    if count not in (1, len(ids)):
        raise click.UsageError(f"--count {count} does not match the {len(ids)} devices in {flag}")
    return Gang(device_ids=tuple(sorted(ids)), count=len(ids))


def devices_text(job: Any) -> str:
    """A job's devices for a message or a column: ``a,b`` for several, else its device."""
    ids = job.get("device_ids") if isinstance(job, dict) else None
    if isinstance(ids, list) and len(ids) > 1:
        return ",".join(str(i) for i in ids)
    return str(job.get("device_id") or "") if isinstance(job, dict) else ""


def as_option() -> Callable[[_F], _F]:
    """The ``--as`` flag (CLI-030)."""
    return click.option(
        "--as", "as_", default="", metavar="ID", help="Submitter identity (default: derived)."
    )
