"""MIG instances as devices (``gpu<i>.mig<j>``): the grammar lives here once, and a GPU and its
instances are never held together (``part_of``; the grant's SQL in ``store/leases.py``)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

#: The detected label that marks a device whose name conflicts with its GPU's MIG mode.
CONFLICT = "mig_conflict"
#: What a MIG instance's name adds to its GPU's: ``gpu0`` + ``.mig`` + ``1``.
SEPARATOR = ".mig"

_NAME = re.compile(r"gpu([0-9]+)(?:\.mig([0-9]+))?", re.ASCII)
_INDEX_MAX = 2**63 - 1


def parse(name: str) -> tuple[int, int | None] | None:
    """``gpu3`` → ``(3, None)``, ``gpu3.mig1`` → ``(3, 1)``, else ``None`` (WRK-077)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    gpu = int(m.group(1))
    mig = int(m.group(2)) if m.group(2) is not None else None
    if gpu > _INDEX_MAX or (mig is not None and mig > _INDEX_MAX):
        return None
    return gpu, mig


def is_instance(name: str) -> bool:
    """The name is a MIG instance's, ``gpu<i>.mig<j>``."""
    parsed = parse(name)
    return parsed is not None and parsed[1] is not None


def gpu_name(index: int) -> str:
    return f"gpu{index}"


def instance_name(gpu: int, mig: int) -> str:
    return f"gpu{gpu}{SEPARATOR}{mig}"


def part_of(part: str, whole: str) -> bool:
    """``part`` is carved out of ``whole``: ``gpu0.mig1`` of ``gpu0``, not ``gpu10.mig0`` of
    ``gpu1``."""
    return part.startswith(whole + SEPARATOR)


def overlap(a: str, b: str) -> bool:
    """Two device names of one host stand for overlapping silicon (and are not one name)."""
    return part_of(a, b) or part_of(b, a)


def overlapping(names: Iterable[str]) -> list[tuple[str, str]]:
    """Every pair of ``names`` that overlap, each pair once, in the order given."""
    seen: list[str] = []
    pairs: list[tuple[str, str]] = []
    for name in names:
        pairs.extend((other, name) for other in seen if overlap(other, name))
        seen.append(name)
    return pairs


def superseded(declared: Collection[str], existing: Iterable[str]) -> dict[str, list[str]]:
    """Undeclared devices whose silicon a declared one now stands for, with those names."""
    wanted = set(declared)
    out: dict[str, list[str]] = {}
    for name in existing:
        if name in wanted:
            continue
        hits = sorted(d for d in wanted if overlap(d, name))
        if hits:
            out[name] = hits
    return out


def superseded_text(replaced_by: list[str]) -> str:
    """The ``mig_conflict`` value the controller writes on a superseded device."""
    return (
        "the host's latest registration offers "
        + ", ".join(replaced_by)
        + " on this GPU instead; this name is no longer offered"
    )
