"""Label-source bookkeeping: which devices each probe source named, and what a pass may
say about them.

A failed source's devices are *unconfirmed* and, unless something else reports a fact
for them, left out of the payload so the controller keeps their stored labels: absence,
``null`` and ``{}`` differ (PROBE-040). ``SourceMemory`` is what outlives a pass; a
``Tally`` is one pass's merge of its sources.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

#: The probes' logger: a pass's warnings read as one subsystem's, whichever module says them.
log = logging.getLogger("resource_controller.worker.probes")

Facts = dict[str, str]
LabelsPayload = dict[str, Facts] | None


@dataclass
class Classified:
    """One source's facts sorted into host-wide and per-device ones."""

    host: Facts = field(default_factory=dict)
    devices: dict[str, Facts] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def named(self) -> frozenset[str]:
        """The devices this source named (device-scoped keys accepted), PROBE-030."""
        return frozenset(name for name, facts in self.devices.items() if facts)


def classify(facts: Mapping[str, str], device_names: Collection[str]) -> Classified:
    """No dot: host-wide; ``<device>.<suffix>``: that device. Any other key is dropped,
    never a host fact: ``gpu0.model`` on a host without ``gpu0`` would stamp every device."""
    out = Classified()
    for key, value in facts.items():
        if not key:
            out.warnings.append("empty key dropped")
        elif "." not in key:
            out.host[key] = value
        elif key.startswith(".") or key.endswith("."):
            out.warnings.append(f"key {key!r} starts or ends with '.'; dropped")
        else:
            device = _device_prefix(key, device_names)
            if device is not None:
                out.devices.setdefault(device, {})[key[len(device) + 1 :]] = value
            else:
                out.warnings.append(f"key {key!r} names no configured device; dropped")
    return out


def _device_prefix(key: str, device_names: Collection[str]) -> str | None:
    """The longest device name ``key`` starts with before a dot (``gpu0.mig1.uuid``)."""
    end = key.rfind(".")
    while end > 0:
        if key[:end] in device_names:
            return key[:end]
        end = key.rfind(".", 0, end)
    return None


def labels_payload(
    host: Mapping[str, str],
    devices: Mapping[str, Mapping[str, str]],
    unconfirmed: Collection[str],
    device_names: Iterable[str],
) -> LabelsPayload:
    """The ``labels`` field of PROBE-040: ``None`` when no fact anywhere; host facts under
    ``""``; per device its facts, ``{}`` (a clear), or nothing when unconfirmed."""
    names = list(device_names)
    if not host and not any(devices.get(n) for n in names):
        return None
    payload: dict[str, Facts] = {}
    if host:
        payload[""] = dict(host)
    for name in names:
        facts = devices.get(name) or {}
        if facts or name not in unconfirmed:
            payload[name] = dict(facts)
    return payload


def warn_keys(source: str, warnings: Iterable[str]) -> None:
    for warning in warnings:
        log.warning("probe %s: %s", source, warning, extra={"action": "probe_key"})


@dataclass
class Pass:
    """What one pass found: host facts, per-device facts, the unconfirmed devices."""

    host: Facts
    devices: dict[str, Facts]
    unconfirmed: frozenset[str]
    labels: LabelsPayload


class SourceMemory:
    """What the sources said across passes, and which warnings were already given."""

    def __init__(self) -> None:
        #: Source → devices it named on its last success in this process.
        self.named: dict[str, frozenset[str]] = {}
        #: Sources and devices already warned about, this failure episode.
        self._clear_warned: set[str] = set()
        self._omit_warned: set[str] = set()


class Tally:
    """One pass's merge of its sources: later ones overwrite earlier ones key by key."""

    def __init__(self, memory: SourceMemory, device_names: Iterable[str]) -> None:
        self._memory = memory
        self.device_names = list(device_names)
        self.host: Facts = {}
        self.devices: dict[str, Facts] = {n: {} for n in self.device_names}
        self.unconfirmed: set[str] = set()
        #: What each source present this pass named, and which were present: the memory.
        self._named: dict[str, frozenset[str]] = {}
        self._present: set[str] = set()

    def rename(self, device_names: Iterable[str]) -> None:
        """The devices changed mid-pass (``devices: auto``); a name that stays keeps its facts."""
        self.device_names = list(device_names)
        self.devices = {n: self.devices.get(n, {}) for n in self.device_names}

    def absorb(self, source: str, facts: Mapping[str, str]) -> None:
        """A source succeeded: merge its facts over the earlier ones and remember it."""
        sorted_facts = classify(facts, self.device_names)
        warn_keys(source, sorted_facts.warnings)
        self.host.update(sorted_facts.host)
        for name, device_facts in sorted_facts.devices.items():
            self.devices[name].update(device_facts)
        self._present.add(source)
        self._named[source] = sorted_facts.named
        self._memory._clear_warned.discard(source)

    def fail(self, source: str, *, otherwise: frozenset[str] | None = None) -> None:
        """Its remembered devices become unconfirmed; ``otherwise``, those it speaks for
        before it named any (nvidia-smi: every GPU device), needing no warning."""
        self._present.add(source)
        previous = self._memory.named.get(source)
        if previous is not None:
            self._named[source] = previous
        if otherwise is not None:
            self.unconfirmed |= previous or otherwise
            return
        if previous:
            self.unconfirmed |= previous
        elif source not in self._memory._clear_warned:
            self._memory._clear_warned.add(source)
            log.warning(
                "probe %s failed and has not named a device in this process: whatever it "
                "used to report will be cleared rather than preserved",
                source,
                extra={"action": "probe_clear"},
            )

    def remembered(self, leave_out: Collection[str] = ()) -> list[str]:
        """Sources an earlier pass remembers that this pass has not heard from yet."""
        return [s for s in self._memory.named if s not in leave_out and s not in self._present]

    def finish(self) -> Pass:
        """The pass's result; a source it did not hear from is forgotten."""
        memory = self._memory
        memory.named = self._named
        memory._clear_warned &= self._present
        labels = labels_payload(self.host, self.devices, self.unconfirmed, self.device_names)
        if labels is None:
            log.error("probe pass produced no facts at all", extra={"action": "probe_empty"})
        for name in self.device_names:
            if labels is not None and name in labels:
                memory._omit_warned.discard(name)
            elif labels is not None and name not in memory._omit_warned:
                memory._omit_warned.add(name)
                log.warning(
                    "device %s: a probe that reported it failed and nothing else did; its "
                    "stored labels are kept as they are",
                    name,
                    extra={"action": "probe_omit"},
                )
        return Pass(self.host, self.devices, frozenset(self.unconfirmed), labels)
