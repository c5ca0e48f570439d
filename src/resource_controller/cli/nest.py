"""``rc run`` inside a job: run under the job's own lease instead of queueing behind it
.

A job's environment names its job and devices (``RC_JOB_ID``, ``RC_DEVICE``, and
``RC_DEVICES`` when the worker sets it). A nested ``rc run`` that asks for one of those
devices, or for no particular device, could only ever be granted after its own caller
ends, so it would wait for ever; instead the command replaces ``rc`` (``exec``) in
the job's environment. Exit code and signals are then the command's own: nothing sits
in between to forward or translate them, and the job's process group, watchdogs and
straggler sweep (``RC_JOB_ID``) cover it as they cover the job.

The decision, by what was asked:

- ``-d DEVICE``: nested when every named device is held by the job (``-d`` may be a
  comma-separated list); any other device takes a new lease as usual;
- neither ``-d`` nor ``--select`` ("any device"): nested;
- ``--select S``: nested when a device the job holds matches S (the controller's
  explain route decides, as for every selector); otherwise a new lease. A
  selector asks for any device with those labels, and the job already holds one: the
  same reasoning that nests "any device", which the spec spells out.

``--max-runtime`` and ``--idle-timeout`` cannot be honoured for a command that runs
under someone else's lease (the job's own limits apply), so a nested run refuses them
rather than accept and ignore them. ``--env`` and ``--cwd`` (and ``--here``) apply to
the command; the queue's own flags (``--priority``, ``--timeout``, ``--no-wait``) have
no queue to act on: the device is already held.
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
    """The held device a nested run uses, or None when the request needs a new lease.

    ``matching`` answers which devices a selector matches (asked only for ``--select``).
    """
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
    """Replace this process with ``command`` in the job's environment (plus ``env``)."""
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as e:
            raise basics.Failure(f"cannot run in {cwd}: {e.strerror or e}") from e
    render.say(
        f"inside job {lease.job_id}: running directly under its lease on {device}"
        " (no new job, nothing queued)"
    )
    # Python ignores SIGPIPE (and SIGXFSZ) itself; an ignored signal stays ignored
    # across exec, so give the command the default actions it would get from a shell.
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
