"""Which GPU index a device name stands for (WRK-077, EXT-GANG-4).

Shared by the worker, which sets ``CUDA_VISIBLE_DEVICES`` for a job, and the Python
client, whose ``lease()`` tells code on the device host the same value, so the two
can never disagree about which GPU a lease covers.
"""

from __future__ import annotations

from collections.abc import Sequence

_INT64_MAX = 2**63 - 1
_ASCII_DIGITS = frozenset("0123456789")


def device_index(device_id: str) -> str | None:
    """The trailing index of a device ID's name, verbatim (WRK-077), or ``None``.

    ``box:gpu1`` → ``1``, ``box:gpu01`` → ``01``, ``box:mydevice`` → ``None``. Only ASCII
    digits count, and a run that does not fit a signed 64-bit integer is no index:
    setting a wrong index would let a job touch a GPU it was never leased.
    """
    _, colon, name = device_id.partition(":")
    if not colon or not name:
        return None
    start = len(name)
    while start > 0 and name[start - 1] in _ASCII_DIGITS:
        start -= 1
    digits = name[start:]
    if not digits or int(digits) > _INT64_MAX:
        return None
    return digits


def cuda_visible_devices(device_ids: Sequence[str]) -> str | None:
    """Comma-joined indices of every device, or ``None`` if any has none (EXT-GANG-4)."""
    indices = [device_index(d) for d in device_ids]
    if not indices or any(i is None for i in indices):
        return None
    return ",".join(i for i in indices if i is not None)
