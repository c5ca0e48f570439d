"""``rc run`` without click, for the command lines people type most.

``rc run -d box:gpu0 -- ./train`` sits on the hot path, and click's import alone costs
several times the interpreter's start. This parser accepts the plain forms: the value
flags (``-d X``, ``-dX``, ``--device X``, ``--device=X``, ``--select``, ``--count``,
``--cwd``, ``--priority``, ``--max-runtime``, ``--idle-timeout``, ``--timeout``,
``--env``), the flags ``--no-wait`` and ``--here``/``--no-here``, and the command,
after ``--`` or as words that do not start with ``-``, exactly as click's parser
reads them (options may follow the command's first word unless ``--`` came first; a
repeated flag's last value wins; ``--env`` accumulates).

Anything else goes to click unchanged: every other flag (``--tty``, ``-i``,
``--explain``, ``--as``, ``-h``, ``--flag=true``), anything this parser cannot place,
and every line that would be refused (a bad value, a missing one, a check of CLI-101
failing), so that each error is click's own. ``tests/cli/test_fastrun.py`` checks over a
matrix of command lines that both parsers build the same ``RunRequest``.
"""

from __future__ import annotations

from resource_controller import errors
from resource_controller.cli import basics, exits, runargs, signals

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from resource_controller.cli.run import RunRequest

#: Long value flags -> the parameter they set.
_VALUE_FLAGS = {
    "--device": "device",
    "--select": "selector",
    "--count": "count",
    "--cwd": "cwd",
    "--priority": "priority",
    "--max-runtime": "max_runtime",
    "--idle-timeout": "idle_timeout",
    "--timeout": "timeout",
    "--env": "env",
}
_DURATIONS = ("max_runtime", "idle_timeout", "timeout")
_INTEGERS = ("count", "priority")


def _words(argv: list[str]) -> tuple[dict[str, str], list[str], list[str], list[str]] | None:
    """Split ``argv`` as click's parser would: (values, env pairs, switches, command)."""
    values: dict[str, str] = {}
    env: list[str] = []
    switches: list[str] = []
    command: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            command.extend(argv[i:])
            break
        if arg[:1] != "-" or len(arg) == 1:
            command.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if arg.startswith("--") and name in _VALUE_FLAGS:
            pass
        elif arg.startswith("-d") and not arg.startswith("--"):
            name, eq, value = "--device", "=" if len(arg) > 2 else "", arg[2:]
        elif arg in ("--no-wait", "--here", "--no-here"):
            switches.append(arg)
            continue
        else:
            return None  # a flag this parser leaves to click
        if not eq:
            if i >= len(argv):
                return None  # click says the value is missing
            value = argv[i]
            i += 1
        if name == "--env":
            env.append(value)
        else:
            values[_VALUE_FLAGS[name]] = value
    return values, env, switches, command


def parse(argv: list[str]) -> RunRequest | None:
    """The request ``rc run ARGV`` makes, or None when click must parse the line."""
    split = _words(argv)
    if split is None:
        return None
    values, env_pairs, switches, command = split
    from resource_controller.core import durations

    seconds: dict[str, float] = {}
    for key in _DURATIONS:
        try:
            seconds[key] = durations.parse_duration(values[key]) if key in values else 0.0
        except durations.DurationError:
            return None
        if seconds[key] < 0:
            return None
    numbers: dict[str, int] = {}
    for key, default in zip(_INTEGERS, (1, 0), strict=True):
        number = basics.parse_int(values[key]) if key in values else default
        if number is None:
            return None
        numbers[key] = number
    here: bool | None = None
    for switch in switches:
        if switch != "--no-wait":
            here = switch == "--here"
    try:
        basics.parse_env(env_pairs)
        for flag, key in (("--max-runtime", "max_runtime"), ("--idle-timeout", "idle_timeout")):
            basics.check_ceiling(flag, seconds[key])
        wanted = runargs.check(
            command=command,
            device=values.get("device", ""),
            selector=values.get("selector", ""),
            count=numbers["count"],
            explain=False,
            tty=False,
            interactive=False,
        )
        return runargs.request(
            wanted,
            command=command,
            selector=values.get("selector", ""),
            cwd=values.get("cwd", ""),
            here=here,
            env_pairs=env_pairs,
            priority=numbers["priority"],
            max_runtime=seconds["max_runtime"],
            idle_timeout=seconds["idle_timeout"],
            timeout=seconds["timeout"],
            no_wait="--no-wait" in switches,
            tty=False,
            interactive=False,
        )
    except (basics.UsageProblem, basics.Failure):
        return None  # refused: click refuses it again, in its own words


def main(argv: list[str]) -> None:
    """Run ``rc run ARGV`` and exit, or return when click must parse the line."""
    req = parse(argv)
    if req is None:
        return
    from resource_controller.cli import run as run_machine
    from resource_controller.client import api

    try:
        code = run_machine.run(api.JsonClient(submitter=None), req)
    except (basics.Failure, signals.Interrupted, errors.RcError) as e:
        exits.failed(e)
    except (EOFError, KeyboardInterrupt):
        exits.say_blank_line()
        exits.fail("interrupted")
    except OSError as e:
        exits.os_error_in_command(e)
    exits.leave_now(code)
