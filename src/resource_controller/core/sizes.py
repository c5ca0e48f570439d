"""Byte-size text (``64KiB``, ``256M``): decimal units are refused rather than guessed."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"([0-9]+)\s*([A-Za-z]*)")


class SizeError(ValueError):
    """Size text did not parse."""


def parse_size(text: str) -> int:
    """Bytes for ``text``; ``SizeError`` naming what is wrong otherwise."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise SizeError(f"invalid size {text!r} (examples: 1048576, 64KiB, 256MiB)")
    digits, unit = m.groups()
    key = unit.lower()
    if key.endswith("ib") and len(key) == 3:
        key = key[0]
    if key not in _UNITS:
        raise SizeError(
            f"invalid size unit {unit!r} in {text!r} (use B, KiB, MiB, GiB or TiB;"
            " K, M, G and T mean the same)"
        )
    return int(digits) * _UNITS[key]
