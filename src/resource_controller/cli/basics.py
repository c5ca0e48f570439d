"""Click-free command pieces: ``rc run`` is parsed without click and needs them."""

from __future__ import annotations


class Failure(Exception):
    """Not a click exception, so its raisers need not load click."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def format_message(self) -> str:
        """The message, as click's exceptions answer it."""
        return self.message

    def __str__(self) -> str:
        return self.message


#: What a boolean flag's explicit value may be (``--no-wait=false``), as click reads it.
TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})

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


def parse_duration(text: str, negative_hint: str = "0 means none") -> float:
    """A duration flag's value in seconds; ``ValueError`` saying why it is refused."""
    from resource_controller.core import durations

    try:
        seconds = durations.parse_duration(text)
    except durations.DurationError:
        raise ValueError(f"invalid duration {text!r} (examples: 90s, 30m, 1h30m)") from None
    if seconds < 0:  # a mistake, never "no limit" (0 is that)
        raise ValueError(f"duration {text!r} is negative ({negative_hint})")
    return seconds


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` values into the submit's ``env`` map (EXT-CLI-2)."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise Failure(f"invalid --env {pair!r}: want KEY=VALUE")
        env[key] = value
    return env
