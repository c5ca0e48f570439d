"""The click-free pieces of the commands: the failure type, integer values, device lists.

``rc run -d X -- true`` is parsed without click when it can be (``cli/fastrun.py``), and
the run machine behind it raises ``Failure``; so these live apart from ``common``
(which builds click's flag types on them) and import nothing but the standard library.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any


class Failure(Exception):
    """A command failed: ``rc: <message>`` on stderr and exit 1.

    Not a click exception, so that the commands that raise it need not load click; the
    group's error handler (``cli/group.py``) and the click-free paths both catch it.
    """

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def format_message(self) -> str:
        """The message, as click's exceptions answer it."""
        return self.message

    def __str__(self) -> str:
        return self.message


class UsageProblem(ValueError):
    """A flag value or combination is wrong; the click layer turns it into a usage error."""


#: CLI-006's integers; compiled on first use (the help pages load this module, not ``re``).
_INT = r"[+-]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|[0-9]+)"


def parse_int(text: str) -> int | None:
    """An integer flag's value: decimal, ``0x``/``0o`` tolerated; None if invalid."""
    import re

    if not re.fullmatch(_INT, text):
        return None
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if digits[:2].lower() in ("0x", "0o"):
        return sign * int(digits, 0)
    return sign * int(digits, 10)


class Gang:
    """The devices a ``-d``/DEVICE and ``--count`` ask for.

    A plain class: a dataclass would import ``dataclasses`` (and ``inspect``) at start-up.
    """

    __slots__ = ("count", "device", "device_ids")

    def __init__(self, device: str = "", device_ids: tuple[str, ...] = (), count: int = 1) -> None:
        self.device = device  #: one exact device
        self.device_ids = device_ids  #: several exact devices on one host, ascending
        self.count = count  #: devices wanted on one host

    @property
    def target(self) -> str:
        return ",".join(self.device_ids) or self.device

    def _key(self) -> tuple[str, tuple[str, ...], int]:
        return (self.device, self.device_ids, self.count)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Gang) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Gang(device={self.device!r}, device_ids={self.device_ids!r}, count={self.count})"


def gang(device: str, count: int, flag: str) -> Gang:
    """Check ``--count`` against a device or comma-separated list, before any request.

    A list is devices on one host (the part of an ID before its first ``:``), and
    implies the count: a ``--count`` other than its length is refused, as is a count
    above 1 with one named device or a count below 1. Raises ``UsageProblem``.
    """
    if count < 1:
        raise UsageProblem(f"--count must be at least 1, got {count}")
    if "," not in device:
        if device and count != 1:
            raise UsageProblem(
                f"--count {count} with one device: name all {count} as a comma list in {flag}"
            )
        return Gang(device=device, count=count)
    ids = [d.strip() for d in device.split(",")]
    if any(not d for d in ids):
        raise UsageProblem(f"{flag} {device!r}: an empty device ID in the list")
    if len(set(ids)) != len(ids):
        raise UsageProblem(f"{flag} {device!r} names a device more than once")
    hosts = sorted({d.split(":", 1)[0] for d in ids})
    if len(hosts) > 1:
        raise UsageProblem(
            f"{flag} {device!r}: the devices must be on one host, not on {', '.join(hosts)}"
        )
    if count not in (1, len(ids)):
        raise UsageProblem(f"--count {count} does not match the {len(ids)} devices in {flag}")
    return Gang(device_ids=tuple(sorted(ids)), count=len(ids))


def parse_env(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` values into the submit's ``env`` map."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageProblem(f"invalid --env {pair!r}: want KEY=VALUE")
        env[key] = value
    return env


#: The longest ceiling the controller takes: ``core.limits.SECONDS``, 2³¹−1
#: seconds, 68 years. Written here, not imported, so that ``rc run``'s start-up loads no
#: dataclass machinery; ``tests/cli/test_flags.py`` holds the two equal.
MAX_CEILING = 2**31 - 1
#: ``MAX_CEILING`` as a duration flag takes it (``durations.render_duration``).
MAX_CEILING_TEXT = "596523h14m7s"


def check_ceiling(flag: str, seconds: float) -> None:
    """Refuse a ceiling the controller could not honour, before any request.

    A positive one under a second would be sent as 0, meaning none; one over
    ``MAX_CEILING`` the controller refuses naming its wire field, not the flag typed.
    """
    if 0 < seconds < 1:
        raise Failure(
            f"{flag} must be at least 1s: ceilings work at one-second granularity"
            " (a shorter one would be sent as 0, meaning no ceiling)"
        )
    if seconds > MAX_CEILING:
        raise Failure(
            f"{flag} must be at most {MAX_CEILING_TEXT} ({MAX_CEILING} seconds, about 68 years)"
        )


def devices_text(job: Any) -> str:
    """A job's devices for a message or a column: ``a,b`` for several, else its device."""
    ids = job.get("device_ids") if isinstance(job, dict) else None
    if isinstance(ids, list) and len(ids) > 1:
        return ",".join(str(i) for i in ids)
    return str(job.get("device_id") or "") if isinstance(job, dict) else ""
