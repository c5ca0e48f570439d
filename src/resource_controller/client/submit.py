"""What a submit carries, how each field is checked, and how it goes on the wire (CLI-072).

``rc run``, ``rc hold``, ``rc cp`` and the Python API all build their submit here: each
hands over what the user gave, under the names the user knows it by (``CLI``: the
flags; ``API``: the arguments), and every check is made here, before any request,
with a refusal (``BadSubmit``, a ``ValueError``) that names the flag or argument.

``FIELDS`` is the body as the controller models it (``wire.SubmitRequest``); a test
holds the two equal, since the model needs pydantic, which ``rc run`` never loads.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

#: Every field of the body and its default; one at its default is left out, but
#: ``submitter`` is always sent (CLI-072).
FIELDS: dict[str, Any] = {
    "device_id": "",
    "selector": "",
    "command": None,
    "cwd": "",
    "env": None,
    "submitter": "",
    "idempotency_key": "",
    "priority": 0,
    "max_runtime_seconds": 0,
    "idle_timeout_seconds": 0,
    "no_wait": False,
    "kind": "",
    "reason": "",
    "stdio": "",
    "count": 1,
    "device_ids": None,
    "after": None,
    "after_any": False,
    "retries": 0,
    "retry_on": "",
    "preemptible": False,
    "no_requeue": False,
    "preempt_grace_seconds": 0,
    "array": "",
}

#: What a refusal calls each value: the Python API's argument names...
API = {
    "device": "device",
    "select": "select",
    "count": "count",
    "max_runtime": "max_runtime",
    "idle_timeout": "idle_timeout",
    "ttl": "ttl",
    "after": "after",
    "after_any": "after_any",
    "no_wait": "no_wait",
    "retries": "retries",
    "retry_on": "retry_on",
    "preemptible": "preemptible",
    "no_requeue": "no_requeue",
    "preempt_grace": "preempt_grace",
    "array": "array",
}
#: ... and the command line's flags.
CLI = {
    "device": "-d/--device",
    "select": "--select",
    "count": "--count",
    "max_runtime": "--max-runtime",
    "idle_timeout": "--idle-timeout",
    "ttl": "--ttl",
    "after": "--after",
    "after_any": "--after-any",
    "no_wait": "--no-wait",
    "retries": "--retries",
    "retry_on": "--retry-on",
    "preemptible": "--preemptible",
    "no_requeue": "--no-requeue",
    "preempt_grace": "--preempt-grace",
    "array": "--array",
}

#: The longest ceiling the controller takes (``core.limits.SECONDS``: 68 years), and the
#: most jobs ``after`` may name (``core.limits.AFTER``); a test holds them equal.
MAX_CEILING = 2**31 - 1
MAX_CEILING_TEXT = "596523h14m7s"
AFTER_MAX = 64
#: The most retries a job may ask for (``core.limits.RETRIES``) and what may call for one.
RETRIES_MAX = 10
RETRY_ON = ("lost", "failed", "any")


class BadSubmit(ValueError):
    """A submit refused before any request; the message names what is wrong."""


def new_idempotency_key() -> str:
    """A fresh random UUID4, without paying for the ``uuid`` module's import."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Submit:
    """One submit, checked: the body's values, the jobs it waits for still as given
    (IDs or prefixes, resolved just before it is sent) and its idempotency key, made
    once so that every retry of it is the same request (CLI-074, EXT-CLI-4).

    A plain class, not a dataclass: ``rc run`` would pay for importing ``dataclasses``.
    """

    __slots__ = (
        "after",
        "after_any",
        "array",
        "command",
        "count",
        "cwd",
        "device_id",
        "device_ids",
        "env",
        "idempotency_key",
        "idle_timeout_seconds",
        "kind",
        "max_runtime_seconds",
        "no_requeue",
        "no_wait",
        "preempt_grace_seconds",
        "preemptible",
        "priority",
        "reason",
        "retries",
        "retry_on",
        "selector",
        "stdio",
    )

    def __init__(
        self,
        command: Sequence[str] | None,
        *,
        device: str | Sequence[str] = "",
        select: str = "",
        count: int = 1,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        priority: int = 0,
        max_runtime: Any = None,
        idle_timeout: Any = None,
        no_wait: bool = False,
        after: Any = None,
        after_any: bool = False,
        kind: str = "",
        reason: str = "",
        stdio: str = "",
        retries: int = 0,
        retry_on: str = "",
        preemptible: bool = False,
        no_requeue: bool = False,
        preempt_grace: Any = None,
        array: str = "",
        names: Mapping[str, str] = API,
    ) -> None:
        self.command = None if command is None else list(command)
        self.device_id, self.device_ids, self.count = devices(device, select, count, names)
        self.selector = select
        self.cwd = cwd
        self.env = dict(env or {})
        self.priority = priority
        self.max_runtime_seconds = ceiling(max_runtime, names["max_runtime"])
        self.idle_timeout_seconds = ceiling(idle_timeout, names["idle_timeout"])
        self.no_wait = no_wait
        self.after = after_ids(after, after_any, no_wait, names)
        self.after_any = after_any
        self.kind = kind
        self.reason = reason
        self.stdio = stdio
        self.retries, self.retry_on = retry_rule(retries, retry_on, names)
        self.preemptible, self.no_requeue = preemptible, no_requeue
        self.preempt_grace_seconds = ceiling(preempt_grace, names["preempt_grace"])
        for flag, given in (("no_requeue", no_requeue), ("preempt_grace", preempt_grace)):
            if given and not preemptible:
                raise BadSubmit(
                    f"{names[flag]} needs {names['preemptible']}: only a preemptible job is"
                    " preempted"
                )
        self.array = array_spec(array, no_wait, stdio, names)
        self.idempotency_key = new_idempotency_key()

    @property
    def target(self) -> str:
        """What was asked for, as the user gave it (``<target>``)."""
        return ",".join(self.device_ids) or self.device_id or self.selector or "any device"

    def body(self, submitter: str, after: Sequence[str] = ()) -> dict[str, Any]:
        """The body: ``after`` the full IDs of the jobs it waits for; every field at its
        default left out; ``count`` also when a device list implies it."""
        values = {name: getattr(self, name, None) for name in FIELDS}
        values.update(
            submitter=submitter,
            after=list(after) or None,
            device_ids=list(self.device_ids) or None,
            env=self.env or None,
            count=1 if self.device_ids else self.count,
        )
        return {k: v for k, v in values.items() if k == "submitter" or v != FIELDS[k]}


def array_spec(array: str, no_wait: bool, stdio: str, names: Mapping[str, str] = API) -> str:
    """An array's spec, checked as the controller checks it (EXT-ARRAY-1); '' for one job."""
    if not array:
        return ""
    if not isinstance(array, str):
        raise TypeError(f"{names['array']} is a spec such as '0-99%8', not {type(array).__name__}")
    if no_wait:
        raise BadSubmit(
            f"{names['array']} and {names['no_wait']} cannot be used together:"
            " an array's tasks queue until they can run"
        )
    if stdio:
        raise BadSubmit(
            f"{names['array']} cannot be used with a terminal or stdin: its tasks run detached"
        )
    from resource_controller.core import arrays

    try:
        arrays.parse(array)
    except arrays.ArraySpecError as e:
        raise BadSubmit(f"{names['array']} {array!r}: {e}") from None
    return array.strip()


def retry_rule(retries: Any, retry_on: str, names: Mapping[str, str] = API) -> tuple[int, str]:
    """(retries, retry_on) checked: 0..10 attempts after the first, on lost, failed or any."""
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise BadSubmit(f"{names['retries']} must be a whole number, got {retries!r}")
    if not 0 <= retries <= RETRIES_MAX:
        raise BadSubmit(f"{names['retries']} {retries} is outside 0..{RETRIES_MAX}")
    if retry_on and retry_on not in RETRY_ON:
        raise BadSubmit(f"{names['retry_on']} {retry_on!r} is not one of {', '.join(RETRY_ON)}")
    if retry_on and not retries:
        raise BadSubmit(f"{names['retry_on']} needs {names['retries']}: the attempts to make")
    return retries, retry_on


def hold(ttl: Any, reason: str, names: Mapping[str, str] = API, **where: Any) -> Submit:
    """A hold's submit: no command, a TTL as its ceiling, a reason (a hold without one
    cannot be told from a leak)."""
    ttl_seconds = ceiling(ttl, names["ttl"])
    if ttl_seconds <= 0:
        raise BadSubmit(f"{names['ttl']} must be positive: a hold for no time holds nothing")
    if not reason.strip():
        raise BadSubmit("a hold needs a reason: say why you hold the device")
    return Submit(None, max_runtime=ttl_seconds, kind="hold", reason=reason, names=names, **where)


def argv(command: Any) -> list[str]:
    """A job's command as a list of strings; a bare string is refused (it would be split
    wrongly)."""
    if isinstance(command, str | bytes):
        raise TypeError("argv is a list of strings, e.g. ['python', 'train.py']")
    out = list(command)
    if not out or not all(isinstance(a, str) for a in out):
        raise BadSubmit("argv must be a non-empty list of strings")
    return out


def seconds(value: Any, what: str) -> float:
    """A duration: seconds, or text such as ``"1h30m"``; ``None`` is 0. Negative refused."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{what} must be seconds or a duration such as '30m'")
    if isinstance(value, str):
        from resource_controller.core import durations

        try:
            value = durations.parse_duration(value.strip())
        except durations.DurationError:
            raise BadSubmit(
                f"invalid {what} {value!r} (examples: 90s, 30m, 1h30m, or a number of seconds)"
            ) from None
    if value < 0:
        raise BadSubmit(f"{what} is negative ({value!r}); 0 means none")
    return float(value)


def ceiling(value: Any, what: str) -> int:
    """A runtime ceiling in whole seconds, toward zero (CLI-073): positive but under one
    second is refused (it would be sent as 0, meaning none), and so is one over what the
    controller takes (EXT-LIMITS-1), naming ``what`` rather than the wire field."""
    out = seconds(value, what)
    if 0 < out < 1:
        raise BadSubmit(
            f"{what} must be at least 1s: ceilings work at one-second granularity"
            " (a shorter one would be sent as 0, meaning no ceiling)"
        )
    if out > MAX_CEILING:
        raise BadSubmit(
            f"{what} must be at most {MAX_CEILING_TEXT} ({MAX_CEILING} seconds, about 68 years)"
        )
    return int(out)


def devices(
    device: str | Sequence[str], select: str, count: int, names: Mapping[str, str] = API
) -> tuple[str, tuple[str, ...], int]:
    """(one device, several on one host ascending, the count) for what was asked (EXT-GANG-1).

    ``device`` is one ID, or several on one host as a list or a comma-separated string,
    which implies the count; ``device`` and ``select`` are exclusive.
    """
    d, c = names["device"], names["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BadSubmit(f"{c} must be at least 1, got {count!r}")
    ids = [i.strip() for i in device.split(",")] if isinstance(device, str) else list(device)
    if not all(isinstance(i, str) for i in ids):
        raise BadSubmit(f"{d} must name devices by ID, got {device!r}")
    ids = [] if ids == [""] else ids
    if ids and select:
        raise BadSubmit(f"{d} and {names['select']} cannot be used together: give one, not both")
    if len(ids) <= 1:
        if ids and count != 1:
            raise BadSubmit(f"{c} {count} with one device: name all {count} as a comma list in {d}")
        return (ids[0] if ids else "", (), count)
    if not all(ids):
        raise BadSubmit(f"{d} {device!r}: an empty device ID in the list")
    if len(set(ids)) != len(ids):
        raise BadSubmit(f"{d} {device!r} names a device more than once")
    hosts = sorted({i.split(":", 1)[0] for i in ids})
    if len(hosts) > 1:
        raise BadSubmit(
            f"{d} {device!r}: the devices must be on one host, not on {', '.join(hosts)}"
        )
    if count not in (1, len(ids)):
        raise BadSubmit(f"{c} {count} does not match the {len(ids)} devices in {d}")
    return ("", tuple(sorted(ids)), len(ids))


def after_ids(
    after: Any, after_any: bool, no_wait: bool, names: Mapping[str, str] = API
) -> list[str]:
    """The jobs a submit waits for (EXT-SHARE-2), each once, in order: one ID or prefix,
    a comma-separated string of them, a job handle (anything with an ``id``), or a list
    of either."""
    a = names["after"]
    items: Iterable[Any]
    if after is None or isinstance(after, str):
        items = after.split(",") if after and after.strip() else []
    elif isinstance(getattr(after, "id", None), str):
        items = [after]
    elif hasattr(after, "__iter__"):
        items = after
    else:
        raise TypeError(f"{a} must be job IDs or jobs, not {type(after).__name__}")
    out: list[str] = []
    for item in items:
        item = getattr(item, "id", item)
        if not isinstance(item, str):
            raise TypeError(f"{a} must be job IDs or jobs, not {type(item).__name__}")
        if not item.strip():
            where = f" in {after!r}" if isinstance(after, str) else ""
            raise BadSubmit(f"{a} has an empty job ID{where}")
        out.append(item.strip())
    out = list(dict.fromkeys(out))
    if after_any and not out:
        raise BadSubmit(f"{names['after_any']} needs {a}: the jobs to wait for")
    if out and no_wait:
        raise BadSubmit(
            f"{a} and {names['no_wait']} cannot be used together: a job that waits for"
            " other jobs cannot start at once"
        )
    if len(out) > AFTER_MAX:
        raise BadSubmit(f"{a} names {len(out)} jobs; at most {AFTER_MAX}")
    return out
