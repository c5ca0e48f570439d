"""``rc run`` inside a job: ``exec`` the command under the job's own lease.

A nested run asking for the job's own devices could only be granted once its caller
ends, so it would wait for ever. Runtime limits cannot be honoured under another's lease,
so they are refused rather than ignored.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from resource_controller.cli import basics, render

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import NamedTuple, NoReturn
else:
    from resource_controller.client.records import NamedTuple

#: Exit codes a shell gives a command it cannot find, or find but not run.
NOT_FOUND = 127
NOT_RUNNABLE = 126


class JobLease(NamedTuple):
    """The job this process runs in, and the devices it holds."""

    job_id: str
    devices: tuple[str, ...]


def current_lease(environ: Mapping[str, str]) -> JobLease | None:
    """The job ``environ`` belongs to, or None outside a job (both variables needed)."""
    job_id = environ.get("RC_JOB_ID", "")
    device = environ.get("RC_DEVICE", "")
    if not job_id or not device:
        return None
    listed = [d for d in environ.get("RC_DEVICES", "").split(",") if d]
    return JobLease(job_id, tuple(dict.fromkeys([device, *listed])))


def chosen_device(
    lease: JobLease, device: str, selector: str, matching: Callable[[str], Sequence[str]]
) -> str | None:
    """The held device a nested run uses, or None when a new lease is needed."""
    if device:
        wanted = [d for d in device.split(",") if d]
        return wanted[0] if wanted and set(wanted) <= set(lease.devices) else None
    if selector:
        found = set(matching(selector))
        return next((d for d in lease.devices if d in found), None)
    return lease.devices[0]


def refuse_limits(lease: JobLease, max_runtime: int, idle_timeout: int) -> None:
    """A nested run cannot carry limits of its own: say so rather than drop them."""
    for flag, value in (("--max-runtime", max_runtime), ("--idle-timeout", idle_timeout)):
        if value:
            raise basics.Failure(
                f"{flag} cannot apply here: this rc run is inside job {lease.job_id} and would"
                " run under that job's lease, whose own limits apply (drop the flag, or ask"
                " for a device the job does not hold)"
            )


def exec_command(
    lease: JobLease, device: str, command: Sequence[str], cwd: str, env: Mapping[str, str]
) -> NoReturn:
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as e:
            raise basics.Failure(f"cannot run in {cwd}: {e.strerror or e}") from e
    render.say(
        f"inside job {lease.job_id}: running directly under its lease on {device}"
        " (no new job, nothing queued)"
    )
    # Python ignores these, and an ignored signal stays ignored across exec.
    for name in ("SIGPIPE", "SIGXFSZ"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), {**os.environ, **env})
    except OSError as e:
        render.say(f"cannot run {command[0]}: {e.strerror or e}")
        code = NOT_FOUND if isinstance(e, FileNotFoundError) else NOT_RUNNABLE
        raise SystemExit(code) from None
