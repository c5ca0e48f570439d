"""Headless Chromium for the dashboard tests, driven by selenium through Debian's
``chromium`` and ``chromium-driver``.

The browser is found at fixed paths and never downloaded: without them the tests skip
on a developer's machine, and fail in CI (``CI`` set), where ``.ci/run`` installs them.
Every chromedriver and every Chromium it started is stopped by PID in ``close``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-extensions",
    "--no-first-run",
)

T = TypeVar("T")


def require_browser() -> None:
    """Skip (or, in CI, fail) unless Chromium, chromedriver and selenium are all here."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if not missing:
        return
    why = "dashboard browser tests need " + ", ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(why + " (CI must have them: .ci/run installs chromium and chromium-driver)")
    pytest.skip(why + " (apt-get install chromium chromium-driver; pip install -e '.[dev]')")


def _descendants(pid: int) -> list[int]:
    """Every live process under ``pid``, read from /proc (children before their parents)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found[::-1]


class Browser:
    """One headless Chromium window, with the few helpers the tests share."""

    def __init__(self, log: Path, width: int = 1280, height: int = 900) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--window-size={width},{height}")
        # Dialogs stay open for the test to read and answer; none is dismissed behind its back.
        options.set_capability("unhandledPromptBehavior", "ignore")
        # An explicit driver path: selenium never looks one up or downloads one.
        self.service = Service(executable_path=CHROMEDRIVER, log_output=str(log))
        self.driver = webdriver.Chrome(service=self.service, options=options)
        self.driver.set_page_load_timeout(20)
        self.driver.set_script_timeout(20)
        self.pids: list[int] = []
        proc = self.service.process
        if proc is not None:
            self.pids = [proc.pid, *_descendants(proc.pid)]

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, predicate: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll ``predicate`` (a DOM read) until it is truthy; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except Exception as exc:  # a node replaced mid-read: read again
                last = exc
                value = None
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")

    def text(self, css: str) -> str:
        """The rendered text of the first element matching ``css`` ("" when none)."""
        return str(
            self.js(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
            )
        )

    def alert_text(self) -> str | None:
        """The open dialog's text, or None when no dialog is open."""
        from selenium.common.exceptions import NoAlertPresentException

        try:
            return self.driver.switch_to.alert.text
        except NoAlertPresentException:
            return None

    def close(self) -> None:
        """Quit the session, then stop by PID whatever of it is still alive."""
        proc = self.service.process
        if proc is not None:  # read before quitting, while they are still its descendants
            self.pids += [p for p in _descendants(proc.pid) if p not in self.pids]
        with contextlib.suppress(Exception):
            self.driver.quit()
        deadline = time.monotonic() + 5
        for pid in self.pids:
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@contextlib.contextmanager
def browser(log: Path, width: int = 1280, height: int = 900) -> Iterator[Browser]:
    b = Browser(log, width, height)
    try:
        yield b
    finally:
        b.close()
