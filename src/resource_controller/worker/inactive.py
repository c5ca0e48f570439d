"""Settings the worker accepts but does not act on yet.

Hooks (§18) and verify scripts (§17) are not built yet. Their keys are valid, so a file written for them loads; but
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
    whose mere existence turns its feature on (``verify_dir``), when it exists.
    """
    found: list[str] = []
    for d in config.devices:
        for key in ("on_acquire", "on_release"):
            if getattr(d, key) is not None:
                found.append(f"devices[{d.name}].{key}")
        if d.timeout != config.hooks.timeout:
            found.append(f"devices[{d.name}].timeout")
        if d.release_linger != config.hooks.release_linger:
            found.append(f"devices[{d.name}].release_linger")
    for key, default in (
        ("hooks.timeout", worker_config.DEFAULT_HOOK_TIMEOUT),
        ("hooks.release_linger", worker_config.DEFAULT_RELEASE_LINGER),
    ):
        if getattr(config.hooks, key.partition(".")[2]) != default:
            found.append(key)
    for key, default in (
        ("verify_timeout", worker_config.DEFAULT_VERIFY_TIMEOUT),
        ("verify_pass_budget", worker_config.DEFAULT_VERIFY_PASS_BUDGET),
    ):
        if getattr(config, key) != default:
            found.append(key)
    path = config.verify_dir
    if path != worker_config.DEFAULT_VERIFY_DIR:
        found.append(f"verify_dir {path}")
    elif os.path.isdir(path):
        found.append(f"verify_dir {path} (exists)")
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
