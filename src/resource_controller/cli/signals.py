"""SIGINT and SIGTERM: the first one interrupts, the second one kills.

``rc`` turns the first signal into an ``Interrupted`` exception, raised from the
handler so that it also breaks out of a blocking socket read or a sleep (a handler
that only set a flag would leave ``rc run`` stuck in a log stream that may last
hours). Before raising, the handler restores the operating system's default action
for both signals, so a second Ctrl-C, or CI's SIGTERM after a SIGINT, ends the
process at once, even while ``rc`` is cancelling a queued job.

Each command decides what an interrupt means for it (cancel, detach, or an ordinary
failure); ``main`` turns an unhandled one into exit 1.

A signal can land while Python runs a finaliser (an ``__del__`` reached by the garbage
collector, a weakref callback): an exception raised there is reported as "ignored" and
dropped, and ``rc logs -f`` would follow on forever with the defaults already restored.
``install`` therefore also hooks ``sys.unraisablehook``: a dropped ``Interrupted`` is
raised again moments later, from a one-shot ``SIGALRM``, in ordinary code.
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
    """The first SIGINT or SIGTERM arrived.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that ``except Exception``
    blocks in libraries let it through, but not a ``KeyboardInterrupt``, which click
    would turn into its own abort.
    """

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
