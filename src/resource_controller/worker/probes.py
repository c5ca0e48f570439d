"""Capability probes: the facts a host and its devices report as detected labels (§16).

A pass runs the built-in facts, ``nvidia-smi`` (and its ``-L`` listing, kept as
``inventory`` for MIG UUIDs and ``devices: auto``) and every drop-in of ``probe_dir``, in
that order; a failing ``-L`` leaves the MIG layout unknown, not absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resource_controller.clock import Clock, SystemClock
from resource_controller.core import durations, mig
from resource_controller.worker import gpus, labelsources, procs
from resource_controller.worker.labelsources import Facts, Pass
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger(__name__)

#: Tests point these at files of their own.
MEMINFO_PATH = "/proc/meminfo"
OSRELEASE_PATH = "/proc/sys/kernel/osrelease"
DISK_PATH = "/"

#: The executable, and the name its facts go by as a source.
NVIDIA_SMI = "nvidia-smi"
CAPTURE_CAP = 65_536
READ_LIMIT = 65_536
#: A failing probe's stderr is quoted up to this many characters.
STDERR_NOTE = 200
BUILTIN = "builtin"


def _mem_total_bytes() -> str | None:
    for line in Path(MEMINFO_PATH).read_text(encoding="utf-8").splitlines():
        if line.startswith("MemTotal:"):
            return str(int(line.split()[1]) * 1024)
    return None


def _disk_free_bytes() -> str:
    st = os.statvfs(DISK_PATH)
    return str(st.f_bavail * st.f_bsize)


_BUILTIN: dict[str, Callable[[], str | None]] = {
    "cpus": lambda: str(len(os.sched_getaffinity(0))),
    "mem_total_bytes": _mem_total_bytes,
    "disk_free_bytes": _disk_free_bytes,
    "kernel": lambda: Path(OSRELEASE_PATH).read_text(encoding="utf-8").strip() or None,
}


def builtin_facts() -> Facts:
    """The built-in host facts (PROBE-004), each omitted if unreadable."""
    facts: Facts = {}
    for key, read in _BUILTIN.items():
        with contextlib.suppress(AttributeError, OSError, ValueError, IndexError):
            if (value := read()) is not None:
                facts[key] = value
    return facts


class DropinError(ValueError):
    """A drop-in's stdout is not one JSON object."""


def _refuse_constant(name: str) -> Any:
    raise DropinError(f"not valid JSON: {name}")


def parse_dropin(stdout: bytes) -> tuple[Facts, list[str]]:
    """A drop-in's stdout, one JSON object, as facts and warnings (PROBE-023): a number
    keeps its literal text, ``null`` drops its key; ``DropinError`` if it is not usable."""
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DropinError(f"output is not UTF-8: {exc}") from exc
    try:
        data = json.loads(text, parse_int=str, parse_float=str, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise DropinError(f"output is not one JSON object: {exc}") from exc
    except RecursionError as exc:
        raise DropinError("output is nested too deeply") from exc
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        raise DropinError(f"output is a JSON {type(data).__name__}, not an object")
    facts: Facts = {}
    warnings: list[str] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, bool):
            facts[key] = "true" if value else "false"
        elif isinstance(value, str):
            facts[key] = value  # strings, and numbers kept as their literal text
        else:
            warnings.append(f"key {key!r} has a nested {type(value).__name__}; dropped")
    return facts, warnings


@dataclass(frozen=True)
class Run:
    """How one probe process went: ``ok``, or the ``problem`` in one line."""

    ok: bool
    stdout: bytes = b""
    stderr: bytes = b""
    problem: str = ""


RunProbe = Callable[[Sequence[str], float], Awaitable[Run]]


async def _read_capped(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, bool]:
    """Everything up to ``cap`` bytes, and whether there was more (read and discarded)."""
    if stream is None:
        return b"", False
    kept = bytearray()
    over = False
    while True:
        block = await stream.read(65_536)
        if not block:
            return bytes(kept), over
        room = cap - len(kept)
        if len(block) > room:
            over = True
            kept += block[: max(room, 0)]
        else:
            kept += block


async def run_probe(
    argv: Sequence[str],
    timeout: float,
    *,
    grace: float = DEFAULT.kill_grace,
    cap: int = CAPTURE_CAP,
) -> Run:
    """One probe as its own process group, bounded by ``timeout`` (PROBE-003), stopped as
    a cancelled job is; stdout and stderr captured apart, up to ``cap`` each."""
    loop = asyncio.get_running_loop()
    try:
        # Keeping the transport, closed on the way out: it never outlives the loop.
        transport, protocol = await loop.subprocess_exec(
            lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=READ_LIMIT, loop=loop),
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return Run(False, problem="start: " + procs.os_error_text("fork/exec", argv[0], exc))
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    pgid = proc.pid
    out = asyncio.ensure_future(_read_capped(proc.stdout, cap))
    err = asyncio.ensure_future(_read_capped(proc.stderr, cap))
    exited = asyncio.ensure_future(proc.wait())
    timed_out = False
    try:
        _, pending = await asyncio.wait({out, err, exited}, timeout=max(timeout, 0.0))
        if pending:
            timed_out = True
            await procs.escalate(pgid, [exited], exited, grace=grace)
            # The group is dead; a pipe still open belongs to something that escaped it.
            await asyncio.wait({out, err}, timeout=1.0)
        elif procs.group_alive(pgid):
            procs.signal_group(pgid, signal.SIGKILL)  # a background child left behind
    except BaseException:
        procs.signal_group(pgid, signal.SIGKILL)
        # Reaped before going on: the child watcher reports the exit to this loop, which
        # the cancellation may be about to close.
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(asyncio.wait({out, err, exited})), 1.0)
        raise
    finally:
        for task in (out, err, exited):
            if not task.done():
                task.cancel()
        transport.close()
    stdout, stdout_over = out.result() if out.done() and not out.cancelled() else (b"", False)
    stderr, _ = err.result() if err.done() and not err.cancelled() else (b"", False)
    code = proc.returncode
    if timed_out:
        return Run(False, stdout, stderr, f"killed after {durations.render_duration(timeout)}")
    if code is not None and code < 0:
        return Run(False, stdout, stderr, f"signal: {procs.signal_word(-code)}")
    if code != 0:
        return Run(False, stdout, stderr, f"exit status {code}")
    if stdout_over:
        return Run(False, stdout, stderr, f"stdout exceeds {cap} bytes")
    return Run(True, stdout, stderr)


class Prober:
    """Runs passes and remembers across them (§16.4); the agent's lock keeps passes apart."""

    def __init__(
        self,
        device_names: Sequence[str],
        probe_dir: str,
        probe_timeout: float,
        *,
        clock: Clock | None = None,
        timings: Timings = DEFAULT,
        run: RunProbe | None = None,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.device_names = list(device_names)
        self.probe_dir = probe_dir
        self.probe_timeout = probe_timeout
        self.clock: Clock = clock or SystemClock()
        self.timings = timings
        self._run: RunProbe = run or (
            lambda argv, timeout: run_probe(argv, timeout, grace=timings.kill_grace)
        )
        self._which = which
        self.sources = labelsources.SourceMemory()
        self.nvidia_at_start: bool | None = None
        #: The latest readable ``nvidia-smi -L``, and the MIG conflicts at the latest pass.
        self.inventory: gpus.Inventory | None = None
        self.conflicts: dict[str, str] = {}
        self._missing_warned: set[str] = set()

    async def run_pass(self, *, discover: bool = False) -> Pass:
        """One pass, never raising for a probe's failure; ``discover``: ``devices: auto``."""
        return await _PassRun(self, discover).go()

    def mig_uuids(self) -> dict[str, str]:
        return self.inventory.mig_uuids() if self.inventory is not None else {}

    async def relist(self) -> gpus.Inventory | None:
        """``nvidia-smi -L`` now, for a job on a MIG instance: re-created ones have new UUIDs."""
        path = self._which(NVIDIA_SMI)
        listed = None if path is None else await self.listing(path, self.probe_timeout, True)
        if listed is None or not listed.gpus:
            return None
        self.remember(listed)
        return listed

    async def listing(
        self, path: str, timeout: float, quiet: bool = False
    ) -> gpus.Inventory | None:
        """One ``nvidia-smi -L``; ``None`` when it failed."""
        run = await self._run([path, *gpus.LIST_ARGS], timeout)
        if not run.ok:
            _warn_failed(NVIDIA_SMI + " -L", run)
            return None
        listed, warnings = gpus.parse_list(run.stdout.decode("utf-8", "replace"))
        labelsources.warn_keys(NVIDIA_SMI, () if quiet else warnings)
        return listed

    def remember(self, listed: gpus.Inventory) -> None:
        """Keep ``listed`` as the latest listing, saying which instances were created again."""
        before = self.mig_uuids()
        for name, uuid in sorted(listed.mig_uuids().items()):
            old = before.get(name)
            if old is not None and old != uuid:
                log.warning(
                    "device %s: MIG device created again: UUID %s is now %s",
                    name,
                    old,
                    uuid,
                    extra={"action": "mig_recreated"},
                )
        self.inventory = listed

    def note_conflicts(self, found: dict[str, str]) -> None:
        """Say each new conflict, and each one that ended."""
        for name, why in sorted(found.items()):
            if self.conflicts.get(name) != why:
                log.warning(
                    "device %s: MIG conflict: %s; the controller does not grant it",
                    name,
                    why,
                    extra={"action": "mig_conflict"},
                )
        for name in sorted(set(self.conflicts) - set(found)):
            if name in self.device_names:
                log.info(
                    "device %s: no MIG conflict any more", name, extra={"action": "mig_conflict"}
                )
        self.conflicts = dict(found)


class _PassRun:
    """One pass while it runs: its sources, in order, fed into its ``Tally``."""

    def __init__(self, prober: Prober, discover: bool = False) -> None:
        self.p = prober
        self.discover = discover
        self.deadline = prober.clock.monotonic() + prober.timings.probe_pass_budget
        self.tally = labelsources.Tally(prober.sources, prober.device_names)

    def remaining(self) -> float:
        return self.deadline - self.p.clock.monotonic()

    def timeout(self) -> float:
        return min(self.p.probe_timeout, self.remaining())

    def fail(self, source: str) -> None:
        """A source failed; nvidia-smi speaks for every GPU device until it named some."""
        otherwise = None
        if source == NVIDIA_SMI:
            otherwise = frozenset(n for n in self.p.device_names if mig.parse(n) is not None)
        self.tally.fail(source, otherwise=otherwise)

    async def go(self) -> Pass:
        self.tally.absorb(BUILTIN, builtin_facts())
        await self.nvidia()
        await self.dropins()
        return self.tally.finish()

    async def nvidia(self) -> None:
        p = self.p
        path = p._which(NVIDIA_SMI)
        if p.nvidia_at_start is None:
            p.nvidia_at_start = path is not None
        if path is None:
            log.debug("nvidia-smi not found on PATH", extra={"action": "probe_nvidia"})
            if p.nvidia_at_start:
                log.warning(
                    "nvidia-smi was on PATH at start-up and is not any more",
                    extra={"action": "probe_failed"},
                )
                self.fail(NVIDIA_SMI)
            return
        if self.remaining() <= 0:
            self.fail(NVIDIA_SMI)
            return
        run = await p._run([path, *gpus.QUERY_ARGS], self.timeout())
        if not run.ok:
            _warn_failed(NVIDIA_SMI, run)
            self.fail(NVIDIA_SMI)
            return
        facts, warnings = gpus.parse_nvidia_smi(run.stdout.decode("utf-8", "replace"))
        labelsources.warn_keys(NVIDIA_SMI, warnings)
        listed = await p.listing(path, self.timeout()) if self.remaining() > 0 else None
        if listed is None:
            # Unknown, not absent: the latest layout stands; with none, the stored one.
            listed = p.inventory
            if listed is None:
                self.fail(NVIDIA_SMI)
                return
        else:
            if self.discover and listed.gpus:
                p.device_names = listed.device_names()
                self.tally.rename(p.device_names)
            p.remember(listed)
        self.tally.absorb(NVIDIA_SMI, self.gpu_facts(facts, listed))

    def gpu_facts(self, facts: Facts, listed: gpus.Inventory) -> Facts:
        """The query's facts with the listing's (EXT-MIG)."""
        p = self.p
        out, found = gpus.merged_facts(listed, facts, p.device_names)
        p.note_conflicts(found)
        self.tally.unconfirmed |= {n for n in p.device_names if listed.unknown(n)}
        for name in p.device_names:
            if listed.missing(name):
                if name not in p._missing_warned:
                    p._missing_warned.add(name)
                    log.warning(
                        "device %s: nvidia-smi no longer lists this GPU; its facts clear",
                        name,
                        extra={"action": "probe_gpu_missing"},
                    )
            else:
                p._missing_warned.discard(name)
        return out

    async def dropins(self) -> None:
        directory = self.p.probe_dir
        try:
            names = sorted(os.listdir(directory), key=os.fsencode)
        except FileNotFoundError:
            return  # No directory, no drop-ins; their memories are forgotten
        except OSError as exc:
            log.warning(
                "probe_dir unreadable, keeping what its probes reported: %s",
                procs.os_error_text("open", directory, exc),
                extra={"action": "probe_dir"},
            )
            for source in self.tally.remembered(leave_out=(BUILTIN, NVIDIA_SMI)):
                self.fail(source)
            return
        for name in names:
            source = os.path.join(directory, name)
            try:
                st = os.stat(source)
            except OSError as exc:
                log.warning(
                    "probe %s failed: %s",
                    source,
                    procs.os_error_text("stat", source, exc),
                    extra={"action": "probe_failed"},
                )
                self.fail(source)
                continue
            if stat.S_ISDIR(st.st_mode) or not st.st_mode & 0o111:
                continue  # not a source this pass
            if self.remaining() <= 0:
                log.warning(
                    "probe %s skipped: the pass exceeded its %s budget",
                    source,
                    durations.render_duration(self.p.timings.probe_pass_budget),
                    extra={"action": "probe_failed"},
                )
                self.fail(source)
                continue
            run = await self.p._run([source], self.timeout())
            if not run.ok:
                _warn_failed(source, run)
                self.fail(source)
                continue
            try:
                facts, warnings = parse_dropin(run.stdout)
            except DropinError as exc:
                _warn_failed(source, Run(False, run.stdout, run.stderr, str(exc)))
                self.fail(source)
                continue
            labelsources.warn_keys(source, warnings)
            self.tally.absorb(source, facts)


def _warn_failed(source: str, run: Run) -> None:
    note = run.stderr.decode("utf-8", "replace")[:STDERR_NOTE].strip()
    log.warning(
        "probe %s failed: %s%s",
        source,
        run.problem,
        f"; stderr: {note}" if note else "",
        extra={"action": "probe_failed"},
    )
