"""``rc run``'s flag values into a ``RunRequest``: the checks of CLI-101, without click.

Both parsers of ``rc run`` (click's in ``cli/jobs.py``, and ``cli/fastrun.py`` for the
plain hot-path forms) hand their values to these two functions, so the checks, their
order and the request built cannot differ between them. A usage problem is raised as
``basics.UsageProblem`` (click's side turns it into a usage error); a sub-second
ceiling as ``basics.Failure``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from resource_controller.cli import basics

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from resource_controller.cli.run import RunRequest

#: What ``--here`` takes from the caller's environment, and nothing else:
#: what decides which interpreter and libraries a command gets. A job's ``env`` is
#: readable by every client, so no other variable is ever sent.
HERE_VARIABLES = (
    "PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
)


def here_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``--here`` variables that are set in ``environ``."""
    return {name: environ[name] for name in HERE_VARIABLES if name in environ}


def check(
    *,
    command: Sequence[str],
    device: str,
    selector: str,
    count: int,
    explain: bool,
    tty: bool,
    interactive: bool,
) -> basics.Gang:
    """CLI-101's checks that come before ``--explain``, in order; the devices asked for."""
    if not explain and not tty and not command:
        raise basics.UsageProblem("rc run needs a command (put it after --)")
    if device and selector:
        raise basics.UsageProblem("-d/--device and --select cannot be used together")
    wanted = basics.gang(device, count, "-d/--device")
    if tty and interactive:
        raise basics.UsageProblem("-i and --tty cannot be used together (--tty forwards stdin)")
    return wanted


#: The most jobs ``--after`` may name (``core.limits.AFTER``).
AFTER_MAX = 64


def after_list(text: str, after_any: bool, no_wait: bool) -> tuple[str, ...]:
    """``--after JOB[,JOB...]`` as the jobs named, each once, in order."""
    ids = [part.strip() for part in text.split(",")] if text else []
    if any(not part for part in ids):
        raise basics.UsageProblem(f"--after has an empty job ID in {text!r}")
    if after_any and not ids:
        raise basics.UsageProblem("--after-any needs --after JOB[,JOB...]: the jobs to wait for")
    if ids and no_wait:
        raise basics.UsageProblem(
            "--after and --no-wait cannot be used together: a job that waits for other"
            " jobs cannot start at once"
        )
    unique = tuple(dict.fromkeys(ids))
    if len(unique) > AFTER_MAX:
        raise basics.UsageProblem(f"--after names {len(unique)} jobs; at most {AFTER_MAX}")
    return unique


def request(
    wanted: basics.Gang,
    *,
    command: Sequence[str],
    selector: str,
    cwd: str,
    here: bool | None,
    env_pairs: Sequence[str],
    priority: int,
    max_runtime: float,
    idle_timeout: float,
    timeout: float,
    no_wait: bool,
    tty: bool,
    interactive: bool,
    after: str = "",
    after_any: bool = False,
) -> RunRequest:
    """The rest of CLI-101 (``--env``, ``--here``, ``--cwd``, ceilings, ``--after``), then
    the request."""
    env = basics.parse_env(list(env_pairs))
    waits_for = after_list(after, after_any, no_wait)
    if here is None:
        from resource_controller.client import config

        here = config.settings().run_here()
    if here:
        cwd = cwd or os.getcwd()
        env = {**here_env(os.environ), **env}  # --env wins
    if cwd and not os.path.isabs(cwd):
        # Relative to where rc runs; an absolute DIR is sent as written.
        cwd = os.path.normpath(os.path.join(os.getcwd(), cwd))
    basics.check_ceiling("--max-runtime", max_runtime)
    basics.check_ceiling("--idle-timeout", idle_timeout)
    from resource_controller.cli import run as run_machine

    if tty and not command:
        from resource_controller.cli.tty import DEFAULT_SHELL

        command = tuple(DEFAULT_SHELL)  # The job row always shows a command
    return run_machine.RunRequest(
        command=list(command),
        device=wanted.device,
        device_ids=wanted.device_ids,
        count=wanted.count,
        selector=selector,
        cwd=cwd,
        env=env,
        priority=priority,
        max_runtime_seconds=int(max_runtime),  # whole seconds, toward zero
        idle_timeout_seconds=int(idle_timeout),
        timeout=timeout,
        no_wait=no_wait,
        tty=tty,
        interactive=interactive,
        after=waits_for,
        after_any=after_any,
    )
