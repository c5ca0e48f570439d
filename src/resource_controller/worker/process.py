"""``rc worker`` as a process: logging, the configuration, signals, the exit status
(WRK-002..004). End-to-end tests can inject nothing, so it alone reads the test hooks
``RC_TEST_TIMINGS`` and ``RC_TEST_BOOT_ID_PATH`` (not configuration: WRK-022).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping

from resource_controller import heap, logfmt
from resource_controller.clock import Clock
from resource_controller.core import testtimings
from resource_controller.worker import agent, procs
from resource_controller.worker import config as worker_config
from resource_controller.worker.timings import Timings

#: The process is the agent's outermost layer: its lines keep the agent's logger.
log = logging.getLogger("resource_controller.worker.agent")

LOGGER = "rc.worker"
BOOT_ID_VAR = "RC_TEST_BOOT_ID_PATH"


_Watchers = tuple[asyncio.AbstractChildWatcher, asyncio.AbstractChildWatcher]


def _watch_children_by_pidfd(loop: asyncio.AbstractEventLoop) -> _Watchers | None:
    """On Python 3.11, a child's exit from its pidfd, not a thread per child parked in
    ``waitpid`` (3.12 does so itself); ``(ours, previous)``."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return None
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return None
    previous = asyncio.get_child_watcher()
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(loop)
    asyncio.set_child_watcher(watcher)
    return watcher, previous


async def _serve_until_signal(
    config: worker_config.WorkerConfig,
    clock: Clock | None,
    timings: Timings,
    log_format: str = "text",
) -> int:
    loop = asyncio.get_running_loop()
    watchers = _watch_children_by_pidfd(loop)
    stop = asyncio.Event()
    watched = (signal.SIGINT, signal.SIGTERM)

    def first_signal(signum: int) -> None:
        # The handlers go the moment the first signal arrives, so a second
        # one takes the default action and ends the process at once.
        for s in watched:
            loop.remove_signal_handler(s)
            signal.signal(s, signal.SIG_DFL)
        log.info(
            "%s received: shutting down",
            signal.Signals(signum).name,
            extra={"action": "signal"},
        )
        stop.set()

    for s in watched:
        loop.add_signal_handler(s, first_signal, s)
    try:
        # The process's environment is fixed once it runs: copied once, not per job.
        base_env = dict(os.environ)
        await agent.Agent(config, clock, timings=timings, base_env=base_env).run(stop)
    except agent.StartupError as exc:
        logfmt.say(log_format, str(exc), "ERROR", logger=LOGGER)
        return 1
    finally:
        for s in watched:
            loop.remove_signal_handler(s)
        if watchers is not None:
            asyncio.set_child_watcher(watchers[1])
            watchers[0].close()
    return 0


def read_test_hooks(environ: Mapping[str, str]) -> Timings:
    """The timings ``RC_TEST_TIMINGS`` asks for, the boot ID moved to ``RC_TEST_BOOT_ID_PATH``."""
    timings = Timings.from_text(environ.get(testtimings.VARIABLE, ""))
    if path := environ.get(BOOT_ID_VAR, ""):
        procs.BOOT_ID_PATH = path
        procs.boot_id.cache_clear()
    return timings


def run_worker(
    config: worker_config.WorkerConfig, *, clock: Clock | None = None, log_format: str = "text"
) -> int:
    """Run the worker in this process until a signal; the process exit status."""
    try:
        timings = read_test_hooks(os.environ)
    except testtimings.TestTimingsError as exc:
        logfmt.say(log_format, str(exc), "ERROR", logger=LOGGER)
        return 1
    heap.settle()
    return asyncio.run(_serve_until_signal(config, clock, timings, log_format))


def main(config_path: str = worker_config.DEFAULT_PATH, log_format: str = "text") -> int:
    """``rc worker -c PATH``: load the configuration and run; the exit status."""
    # At INFO: events (registration, a job's start and end, warnings), not every poll.
    logfmt.configure(log_format, logging.INFO, stream=sys.stderr)
    try:
        cfg = worker_config.load_config(config_path)
    except worker_config.ConfigError as exc:
        logfmt.say(log_format, str(exc), "ERROR", logger=LOGGER)
        return 1
    return run_worker(cfg, log_format=log_format)
