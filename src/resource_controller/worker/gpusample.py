"""What a job's GPUs did while it ran: sampled in the background, never waited for.

Every ``gpu_sample_interval`` each GPU device of a running job (one with a ``uuid``
label, or named ``gpu<index>``) is asked, as its own bounded process::

    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -i <index|uuid>

A reading that cannot be trusted adds nothing, and the first of each kind is logged once
per job; stopping cancels the round in flight and reports the readings already taken.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resource_controller.worker import probes

log = logging.getLogger(__name__)

#: Exactly this query; ``-i <target>`` is added per device.
QUERY_ARGS = (
    "--query-gpu=utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
)
MIB = 1 << 20
_GPU_INDEX = re.compile(r"gpu([0-9]+)")
_NOTE = 200

Sleep = Callable[[float], Awaitable[None]]


def target(name: str, labels: Mapping[str, str]) -> str | None:
    """What ``-i`` names: the ``uuid`` label, else ``gpu<index>``'s index; ``None``: no GPU."""
    uuid = (labels.get("uuid") or "").strip()
    if uuid:
        return uuid
    m = _GPU_INDEX.fullmatch(name)
    return str(int(m.group(1))) if m else None


@dataclass(frozen=True)
class Reading:
    """One device's answer; a part is ``None`` when it was not a number in range."""

    util: float | None
    mem_bytes: int | None


def _number(text: str, high: float) -> float | None:
    """A number in ``0..high``; ``None`` for ``[N/A]`` or anything else that is not one."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= high else None


def parse(text: str) -> Reading | str:
    """Exactly one line of two fields, else the problem as text; a field out of range is
    unknown, the other still counts."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) != 1:
        return f"{len(lines)} lines, not 1: {text.strip()[:_NOTE]!r}"
    fields = [f.strip() for f in lines[0].split(",")]
    if len(fields) != 2:
        return f"{len(fields)} fields, not 2: {lines[0][:_NOTE]!r}"
    util = _number(fields[0], 100)
    mib = _number(fields[1], float(2**63 - 1) / MIB)
    return Reading(util, None if mib is None else int(mib * MIB))


class ReadingTally:
    def __init__(self) -> None:
        self.samples = 0
        self._util_sum = 0.0
        self._util_n = 0
        self.mem_peak: int | None = None

    def add(self, r: Reading) -> None:
        if r.util is None and r.mem_bytes is None:
            return
        self.samples += 1
        if r.util is not None:
            self._util_sum += r.util
            self._util_n += 1
        if r.mem_bytes is not None:
            self.mem_peak = max(self.mem_peak or 0, r.mem_bytes)

    def fields(self) -> dict[str, Any]:
        """The terminal report's fields: only those some reading gave."""
        out: dict[str, Any] = {}
        if self._util_n:
            out["gpu_util_mean"] = round(self._util_sum / self._util_n, 1)
        if self.mem_peak is not None:
            out["gpu_mem_peak_bytes"] = self.mem_peak
        if self.samples:
            out["samples"] = self.samples
        return out


#: Sampled runs of this process that were cancelled and are still unwinding (their
#: process group already killed): kept referenced until they end.
_winding: set[asyncio.Task[None]] = set()


class Sampler:
    """Samples one job's GPU devices until ``stop``."""

    def __init__(
        self,
        job_id: str,
        targets: Mapping[str, str],
        *,
        interval: float,
        timeout: float,
        run: probes.RunProbe,
        which: Callable[[str], str | None] = shutil.which,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.job_id = job_id
        self.targets = dict(targets)
        self.interval = interval
        self.timeout = timeout
        self._run = run
        self._which = which
        self._sleep = sleep
        self.tally = ReadingTally()
        self._said: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin: the first round one interval from now."""
        self._task = asyncio.create_task(self._loop(), name=f"gpu-sample-{self.job_id}")

    def stop(self) -> dict[str, Any]:
        """End now, without waiting for a round in flight; the report's fields."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            _winding.add(task)
            task.add_done_callback(_winding.discard)
        return self.tally.fields()

    async def _loop(self) -> None:
        while True:
            await self._sleep(self.interval)
            await self.round()

    async def round(self) -> None:
        """One reading of every device, at once; each bounded by ``timeout``."""
        path = self._which(probes.NVIDIA_SMI)
        if path is None:
            self._once("", "nvidia-smi is not on PATH", logging.DEBUG)
            return
        await asyncio.gather(*(self._read(path, d, t) for d, t in self.targets.items()))

    async def _read(self, path: str, device_id: str, target: str) -> None:
        run = await self._run([path, *QUERY_ARGS, "-i", target], self.timeout)
        if not run.ok:
            err = run.stderr.decode("utf-8", "replace").strip()[:_NOTE]
            self._once(device_id, run.problem + (f": {err}" if err else ""))
            return
        got = parse(run.stdout.decode("utf-8", "replace"))
        if isinstance(got, str):
            self._once(device_id, "unreadable answer: " + got)
            return
        if got.util is None or got.mem_bytes is None:
            # A MIG instance has no utilisation of its own ([N/A]): usual, so quiet.
            answer = run.stdout.decode("utf-8", "replace").strip()[:_NOTE]
            self._once(device_id, f"a value unknown: {answer!r}", logging.DEBUG)
        self.tally.add(got)

    def _once(self, device_id: str, problem: str, level: int = logging.WARNING) -> None:
        kind = problem.split(":", 1)[0]
        if (device_id, kind) in self._said:
            return
        self._said.add((device_id, kind))
        log.log(
            level,
            "job %s: GPU sampling%s: %s (said once per job; the job is not affected)",
            self.job_id,
            f" of {device_id}" if device_id else "",
            problem,
            extra={"action": "gpu_sample", "job_id": self.job_id},
        )


def targets_of(
    device_ids: Sequence[str], labels_of: Callable[[str], Mapping[str, str]]
) -> dict[str, str]:
    """Device ID -> ``-i`` target for each GPU among a job's devices (``host:name`` IDs)."""
    names = {device_id: device_id.split(":", 1)[-1] for device_id in device_ids}
    found = {device_id: target(name, labels_of(name)) for device_id, name in names.items()}
    return {device_id: t for device_id, t in found.items() if t is not None}
