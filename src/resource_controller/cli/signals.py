"""The first SIGINT/SIGTERM raises ``Interrupted``, the second kills.

Raised from the handler, not a flag, to break out of blocking reads. ``install`` also
hooks ``sys.unraisablehook``: an ``Interrupted`` dropped in a finaliser is raised again
from a one-shot ``SIGALRM``.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_REDELIVERY_DELAY = 0.01  # seconds: long enough to be out of the finaliser
_installed = False
_hooked = False


class Interrupted(BaseException):
    """Not a ``KeyboardInterrupt``, which click would turn into its own abort."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _handler(signum: int, frame: FrameType | None) -> None:
    restore_defaults()
    raise Interrupted(signum)


def _redeliver(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    raise Interrupted(_dropped.pop() if _dropped else signal.SIGINT)


_dropped: list[int] = []


def _on_unraisable(unraisable: Any) -> None:
    """Raise a dropped ``Interrupted`` again; hand anything else to the previous hook."""
    import threading  # not at the top: every rc start imports this module

    exc = unraisable.exc_value
    if isinstance(exc, Interrupted) and threading.current_thread() is threading.main_thread():
        _dropped[:] = [exc.signum]
        signal.signal(signal.SIGALRM, _redeliver)
        signal.setitimer(signal.ITIMER_REAL, _REDELIVERY_DELAY)
        return
    _previous_hook(unraisable)


_previous_hook = sys.unraisablehook


def install() -> None:
    """Intercept the first SIGINT/SIGTERM of this process (call from the main thread)."""
    global _installed, _hooked
    try:
        for sig in _SIGNALS:
            signal.signal(sig, _handler)
    except ValueError:  # not the main thread: leave signals alone
        return
    _installed = True
    if not _hooked:
        sys.unraisablehook = _on_unraisable
        _hooked = True


def restore_defaults() -> None:
    """Give both signals their default action back, if ``install`` took them."""
    global _installed
    if not _installed:
        return
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    _installed = False
