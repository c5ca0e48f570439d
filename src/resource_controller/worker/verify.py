"""The verify pass (§17): each entry of ``verify_dir``, in byte order, run as a hook with
``RC_EVENT=verify``. Missing turns it off; unlistable fails it (one ``chmod 000`` never
marks every device verified).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from resource_controller.clock import Clock
from resource_controller.core import durations
from resource_controller.worker import hooks, procs
from resource_controller.worker.timings import Timings

log = logging.getLogger(__name__)

CAPTURE_CAP = 65_536
STDERR_TAIL = 200

PREFIX = "verify failed: "


def stderr_tail(stderr: bytes, truncated: bool) -> str:
    """Trimmed stderr, its last 200 bytes when longer, noting a capture overflow."""
    text = stderr.strip()
    if not text:
        return ""
    if len(text) > STDERR_TAIL:
        tail = "...(truncated)" + text[-STDERR_TAIL:].decode("utf-8", errors="replace")
    else:
        tail = text.decode("utf-8", errors="replace")
    return tail + (" (stderr itself was truncated)" if truncated else "")


def failure_reason(name: str, run: hooks.HookResult) -> str:
    """``verify failed: <name>: <detail>[: <stderr tail>]`` (VERIFY-006)."""
    reason = f"{PREFIX}{name}: {'' if run.started else 'run: '}{run.detail}"
    tail = stderr_tail(run.output, run.truncated)
    return f"{reason}: {tail}" if tail else reason


def script_names(verify_dir: str) -> list[str]:
    """Its entries but directories, in byte order; ``OSError`` when it cannot be listed."""
    with os.scandir(verify_dir) as entries:
        names = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
    return sorted(names, key=os.fsencode)


@dataclass(frozen=True)
class VerifyOutcome:
    """One pass: ``reason`` is ``""`` when the device is clean; ``ran`` scripts."""

    reason: str = ""
    ran: int = 0

    @property
    def clean(self) -> bool:
        return not self.reason


async def verify_pass(
    verify_dir: str,
    *,
    device_id: str,
    job_id: str,
    submitter: str,
    timeout: float,
    budget: float,
    clock: Clock,
    timings: Timings,
    base_env: Mapping[str, str] = os.environ,
    mig_uuids: Mapping[str, str] | None = None,
) -> VerifyOutcome:
    """Run the pass for one device after one job (VERIFY-001..007)."""
    try:
        names = script_names(verify_dir)
    except FileNotFoundError:
        return VerifyOutcome()  # off
    except OSError as exc:
        return VerifyOutcome(
            PREFIX + "read verify_dir: " + procs.os_error_text("open", verify_dir, exc)
        )
    env = hooks.hook_env(base_env, "verify", device_id, job_id, submitter, mig_uuids)
    over = f"{PREFIX}pass exceeded its {durations.render_duration(budget)} budget"
    started = clock.monotonic()
    first = ""
    ran = 0
    for name in names:
        left = budget - (clock.monotonic() - started)
        if left <= 0:
            return VerifyOutcome(first or over, ran)
        path = os.path.join(verify_dir, name)
        try:
            st = os.stat(path)
        except OSError as exc:
            first = first or f"{PREFIX}{name}: stat: {procs.os_error_text('stat', path, exc)}"
            continue
        if not st.st_mode & 0o111:
            log.warning(
                "device %s: verify script %s is not executable (mode %s): skipped",
                device_id,
                path,
                stat.filemode(st.st_mode),
                extra={"action": "verify_skipped", "job_id": job_id},
            )
            continue
        run = await hooks.run_hook(
            path,
            env,
            timeout=min(timeout, left),
            cancel=asyncio.Event(),
            clock=clock,
            timings=timings,
            stderr_cap=CAPTURE_CAP,
        )
        ran += 1
        if run.ok:
            continue
        if clock.monotonic() - started >= budget:
            return VerifyOutcome(first or over, ran)
        first = first or failure_reason(name, run)
    return VerifyOutcome(first, ran)
