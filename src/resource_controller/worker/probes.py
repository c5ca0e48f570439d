"""Facts about the host, turned into the ``labels`` payload of a registration.

For now only the built-in host facts of PROBE-004 are gathered (no nvidia-smi, no
drop-in probes, so no device is ever "unconfirmed"). The payload shape already follows
PROBE-040, because the controller reads absence, ``null`` and ``{}`` differently: a
device missing from the object keeps its stored labels, so every configured device is
named (as ``{}``) for the host facts to reach it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

log = logging.getLogger(__name__)

#: Sources of the built-in facts; tests point them at files of their own.
MEMINFO_PATH = "/proc/meminfo"
OSRELEASE_PATH = "/proc/sys/kernel/osrelease"
DISK_PATH = "/"

Facts = dict[str, str]
LabelsPayload = dict[str, Facts] | None


def _cpus() -> str | None:
    try:
        return str(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return None


def _mem_total_bytes() -> str | None:
    try:
        with open(MEMINFO_PATH, encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return str(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _disk_free_bytes() -> str | None:
    try:
        st = os.statvfs(DISK_PATH)
    except OSError:
        return None
    return str(st.f_bavail * st.f_bsize)


def _kernel() -> str | None:
    try:
        with open(OSRELEASE_PATH, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def builtin_facts() -> Facts:
    """``cpus``, ``mem_total_bytes``, ``disk_free_bytes``, ``kernel``; each omitted if unreadable."""
    facts: Facts = {}
    for key, read in (
        ("cpus", _cpus),
        ("mem_total_bytes", _mem_total_bytes),
        ("disk_free_bytes", _disk_free_bytes),
        ("kernel", _kernel),
    ):
        value = read()
        if value is not None:
            facts[key] = value
    return facts


def labels_payload(host_facts: Facts, device_names: Iterable[str]) -> LabelsPayload:
    """The ``labels`` field of PROBE-040 for a pass with host facts only.

    ``None`` (sent as JSON ``null``: "say nothing") when the pass found nothing at all;
    otherwise host facts under ``""`` and every device as an explicit ``{}``.
    """
    if not host_facts:
        log.error("probe pass produced no facts at all", extra={"action": "probe_empty"})
        return None
    payload: dict[str, Facts] = {"": dict(host_facts)}
    for name in device_names:
        payload[name] = {}
    return payload
