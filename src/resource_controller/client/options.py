"""Argument checks shared by ``Client`` and ``AsyncClient``.

Both clients take durations as seconds or as the CLI's duration text (``"30m"``) and refuse what ``rc`` refuses, before any request, with a message that
names the argument: a flag either works or is refused.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from resource_controller import errors
from resource_controller.client import api
from resource_controller.core import durations, limits

#: A duration argument: seconds, or text such as ``"90s"``, ``"1h30m"``.
Duration = float | int | str


class CountNotHonoured(errors.ClientError):
    """The controller placed a multi-device job on fewer devices than asked for."""


def seconds(value: Duration | None, what: str) -> float:
    """``value`` in seconds; ``None`` is 0 (none). Negative is refused."""
    if value is None:
        return 0.0
    if isinstance(value, bool):
        raise TypeError(f"{what} must be seconds or a duration such as '30m', not a bool")
    if isinstance(value, str):
        try:
            out = durations.parse_duration(value.strip())
        except durations.DurationError:
            raise ValueError(
                f"invalid {what} {value!r} (examples: 90s, 30m, 1h30m, or a number of seconds)"
            ) from None
    elif isinstance(value, int | float):
        out = float(value)
    else:
        raise TypeError(f"{what} must be seconds or a duration such as '30m'")
    if out < 0:
        raise ValueError(f"{what} is negative ({value!r}); 0 means none")
    return out


def ceiling(value: Duration | None, what: str) -> int:
    """A runtime ceiling in whole seconds: under one second but positive is refused."""
    out = seconds(value, what)
    if 0 < out < 1:
        raise ValueError(
            f"{what} must be at least 1s: ceilings work at one-second granularity"
            " (a shorter one would be sent as 0, meaning no ceiling)"
        )
    return int(out)


def after_ids(after: object, after_any: bool, no_wait: bool) -> list[str]:
    """The jobs ``after`` names, each once, in order, as IDs or prefixes still to resolve
    : one ID, a comma-separated string of them, a job handle, or a list of
     either. Checked before any request, as ``rc run --after`` checks them."""
    from resource_controller.client.models import JobInfo

    items: list[object]
    if after is None:
        items = []
    elif isinstance(after, str):
        items = [a.strip() for a in after.split(",")] if after.strip() else []
    elif isinstance(after, JobInfo):
        items = [after]
    elif isinstance(after, Iterable):
        items = list(after)
    else:
        raise TypeError(f"after must be job IDs or jobs, not {type(after).__name__}")
    out: list[str] = []
    for item in items:
        if isinstance(item, JobInfo):
            item = item.id
        if not isinstance(item, str):
            raise TypeError(f"after must be job IDs or jobs, not {type(item).__name__}")
        if not item.strip():
            raise ValueError("after names an empty job ID")
        out.append(item.strip())
    out = list(dict.fromkeys(out))
    if after_any and not out:
        raise ValueError("after_any needs after: the jobs to wait for")
    if out and no_wait:
        raise ValueError(
            "no_wait and after cannot be used together: a job that waits for"
            " other jobs cannot start at once"
        )
    if limits.AFTER.count is not None and len(out) > limits.AFTER.count:
        raise ValueError(f"after names {len(out)} jobs; at most {limits.AFTER.count}")
    return out


@dataclass(frozen=True)
class Target:
    """Where a job goes: one device, a list of devices on one host, or ``count`` of any."""

    device: str
    device_ids: tuple[str, ...]
    count: int


def target(device: str | Sequence[str], select: str, count: int) -> Target:
    """Check a request's devices before any request.

    ``device`` is one ID, or several on one host as a list (or a comma-separated
    string, as ``-d`` takes them), which implies the count; ``device`` and ``select``
    are exclusive and ``count`` is at least 1.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer (got {count!r})")
    ids = [d.strip() for d in device.split(",")] if isinstance(device, str) else list(device)
    ids = [] if ids == [""] else ids
    if not all(isinstance(d, str) and d for d in ids):
        raise ValueError(f"device must name devices by ID, got {device!r}")
    if ids and select:
        raise ValueError("give device or select, not both")
    if len(ids) <= 1:
        if ids and count != 1:
            raise ValueError(f"count={count} with one device: name all {count} devices")
        return Target(ids[0] if ids else "", (), count)
    if len(set(ids)) != len(ids):
        raise ValueError(f"device names a device more than once: {device!r}")
    if count not in (1, len(ids)):
        raise ValueError(f"count={count} does not match the {len(ids)} devices named")
    return Target("", tuple(sorted(ids)), len(ids))


def check_argv(argv: Sequence[str]) -> list[str]:
    """A command as a list of strings; a bare string is refused (it would be split wrongly)."""
    if isinstance(argv, str | bytes):
        raise TypeError("argv is a list of strings, e.g. ['python', 'train.py']")
    out = list(argv)
    if not out or not all(isinstance(a, str) for a in out):
        raise ValueError("argv must be a non-empty list of strings")
    return out


def default_reason() -> str:
    """A lease's reason when the caller gave none: which program on which host holds it.

    A hold without a reason cannot be told from a leak; this one names the
    process, which is what a person looking at ``rc devices`` needs to find it.
    """
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog} (pid {os.getpid()} on {socket.gethostname()})"


def count_shortfall(job: api.Json, count: int) -> str:
    """Why a placed job does not hold the ``count`` devices asked for, or ``""``.

    A controller without EXT-GANG ignores ``count``; running such a job on one device
    would be a flag accepted and ignored, so the caller kills it and raises.
    """
    if count <= 1 or job.get("state") == "queued":
        return ""
    ids = job.get("device_ids")
    held = len(ids) if isinstance(ids, list) and ids else (1 if job.get("device_id") else 0)
    if held >= count or (job.get("state") in api.TERMINAL_STATES and not job.get("started_at")):
        return ""
    return (
        f"asked for {count} devices but the controller placed job {job.get('id')} on {held}:"
        " it does not support count (EXT-GANG); the job was killed"
    )


def check_usage(since: str, by: str) -> None:
    """``usage()``'s arguments as the controller will read them:
    ``ValueError`` naming the one that is wrong, before any request."""
    from resource_controller.core import usage

    if not isinstance(since, str) or not isinstance(by, str):
        raise TypeError("since and by are text: since='7d', by='submitter'")
    usage.parse_since(since)
    usage.check_by(by)
