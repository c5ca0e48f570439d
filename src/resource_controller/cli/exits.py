"""How ``rc`` ends, shared by click and the click-free paths so a failure reads the same."""

from __future__ import annotations

import os
import sys

from resource_controller import errors
from resource_controller.cli import basics, render, signals

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import NoReturn


def one_line(text: str) -> str:
    """A message folded onto one line (CLI-041: one line on stderr)."""
    return " ".join(text.split())


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def leave_now(code: int) -> NoReturn:
    """Skips the teardown (~3 ms of a ~35 ms ``rc run``) when no thread or atexit needs it."""
    code = _flushed(code)
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        code = code or 1
    threads = sys.modules.get("threading")
    alone = threads is None or threads.active_count() == 1
    import atexit

    if alone and not atexit._ncallbacks():
        os._exit(code)
    sys.exit(code)


def fail(message: str, code: int = 1) -> NoReturn:
    render.say(message)
    leave(code)


def leave(code: int) -> NoReturn:
    """Flush stdout and exit; a closed pipe there turns a success into a failure."""
    sys.exit(_flushed(code))


def _flushed(code: int) -> int:
    """Flush stdout; the exit code once a closed pipe there turned a success into a failure."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        if code == 0:
            render.say("cannot write output: broken pipe")
            code = 1
    except (OSError, ValueError):
        code = code or 1
    return code


def failed(exc: BaseException) -> NoReturn:
    """End the process for an exception no command handled; re-raise what is not ours."""
    if isinstance(exc, basics.Failure):
        fail(one_line(exc.format_message()), exc.exit_code)
    if isinstance(exc, signals.Interrupted):
        fail("interrupted")
    if isinstance(exc, errors.RcError):
        fail(one_line(str(exc)))
    if isinstance(exc, BrokenPipeError):
        silence_stdout()
        fail("cannot write output: broken pipe")
    if isinstance(exc, OSError):
        fail(f"cannot write output: {exc.strerror or exc}")
    raise exc


def say_blank_line() -> None:
    """The newline click writes to stderr on Ctrl-C, closing the terminal's ``^C`` echo."""
    try:
        sys.stderr.write("\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def os_error_in_command(exc: OSError) -> NoReturn:
    """As click's ``main`` ends it: EPIPE exits 1 silently."""
    import errno

    if exc.errno != errno.EPIPE:
        failed(exc)
    silence_stdout()
    sys.exit(1)
