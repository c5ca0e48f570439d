"""Which GPU a device name stands for in ``CUDA_VISIBLE_DEVICES``: one rule for the worker and the
client's ``lease()``, so the two never disagree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from resource_controller.core import mig

_INT64_MAX = 2**63 - 1
_ASCII_DIGITS = frozenset("0123456789")


def device_index(device_id: str) -> str | None:
    """The trailing index of a device ID's name, verbatim (``box:gpu01`` → ``01``), or ``None`` (no
    digits, past 64 bits, a MIG instance): a wrong index could touch a GPU never leased."""
    _, colon, name = device_id.partition(":")
    if not colon or not name or mig.is_instance(name):
        return None
    start = len(name)
    while start > 0 and name[start - 1] in _ASCII_DIGITS:
        start -= 1
    digits = name[start:]
    if not digits or int(digits) > _INT64_MAX:
        return None
    return digits


def visible_id(device_id: str, mig_uuids: Mapping[str, str] | None = None) -> str | None:
    """What names this one device to CUDA: a MIG instance's UUID from ``mig_uuids``
    (device name → ``MIG-...``), else the trailing index; ``None`` when neither is known."""
    _, _, name = device_id.partition(":")
    if mig.is_instance(name):
        uuid = (mig_uuids or {}).get(name, "")
        return uuid or None
    return device_index(device_id)


def cuda_visible_devices(
    device_ids: Sequence[str], mig_uuids: Mapping[str, str] | None = None
) -> str | None:
    """Comma-joined ``visible_id`` of every device, or ``None`` if any has none."""
    ids = [visible_id(d, mig_uuids) for d in device_ids]
    if not ids or any(i is None for i in ids):
        return None
    return ",".join(i for i in ids if i is not None)
