"""Settings the worker accepts but does not act on yet.

Drop-in and interval probes (§16) and usage sheets (§19) are not built yet (hooks,
§18, and verify scripts, §17, are). Their keys are valid, so a file written for them loads; but
none of them works, and a configuration that sets one must not look as if it did: the
worker names them all in one warning at start. This module shrinks as those sections
land.
"""

from __future__ import annotations

import logging
import os

from resource_controller.worker import config as worker_config

log = logging.getLogger(__name__)


def not_yet_active(config: worker_config.WorkerConfig) -> list[str]:
    """Those settings of ``config`` that are set, each named (with why, for a directory).

    A key counts as set when its value differs from the default, or, for a directory
    whose mere existence turns its feature on (``probe_dir``, the sheet files under
    ``sheet_dir``), when it exists.
    """
    found: list[str] = []
    for key, default in (
        ("probe_interval", worker_config.DEFAULT_PROBE_INTERVAL),
        ("probe_timeout", worker_config.DEFAULT_PROBE_TIMEOUT),
    ):
        if getattr(config, key) != default:
            found.append(key)
    if config.probe_dir != worker_config.DEFAULT_PROBE_DIR:
        found.append(f"probe_dir {config.probe_dir}")
    elif os.path.isdir(config.probe_dir):
        found.append(f"probe_dir {config.probe_dir} (exists)")
    sheets = (os.path.join(config.sheet_dir, "host.md"), os.path.join(config.sheet_dir, "host.d"))
    if config.sheet_dir != worker_config.DEFAULT_SHEET_DIR:
        found.append(f"sheet_dir {config.sheet_dir}")
    elif any(os.path.exists(p) for p in sheets):
        found.append(f"sheet_dir {config.sheet_dir} (usage sheets exist)")
    return found


def warn_not_yet_active(config: worker_config.WorkerConfig) -> None:
    """One warning at start naming every ``not_yet_active`` setting; silence if none."""
    inactive = not_yet_active(config)
    if inactive:
        log.warning(
            "configured but not active in this worker yet, so ignored: %s",
            "; ".join(inactive),
            extra={"action": "config_inactive"},
        )
