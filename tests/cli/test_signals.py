"""The first SIGINT/SIGTERM interrupts; after it both signals have their default action (CLI-055)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from resource_controller.cli import signals


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        signals.restore_defaults()
        for sig, handler in before.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_raises_and_restores_defaults(saved_handlers: None, sig: int) -> None:
    signals.install()
    with pytest.raises(signals.Interrupted) as info:
        os.kill(os.getpid(), sig)
        signal.sigtimedwait([], 0.5)  # let the handler run
    assert info.value.signum == sig
    assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_restore_is_a_no_op_unless_installed(saved_handlers: None) -> None:
    marker = signal.getsignal(signal.SIGINT)
    signals.restore_defaults()
    assert signal.getsignal(signal.SIGINT) is marker


def test_interrupted_is_not_an_exception() -> None:
    # ``except Exception`` in libraries must let it through, and click must not turn it
    # into its own abort (which it does for KeyboardInterrupt).
    assert not issubclass(signals.Interrupted, Exception)
    assert not issubclass(signals.Interrupted, KeyboardInterrupt)


class _InterruptedInFinaliser:
    """An object whose finaliser is where the signal lands."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0.5)  # the handler runs here, inside ``__del__``


def test_an_interrupt_dropped_by_a_finaliser_is_raised_again(saved_handlers: None) -> None:
    # Python reports an exception raised in ``__del__`` as ignored and drops it; without
    # the redelivery ``rc logs -f`` went on following after its one SIGINT.
    alarm = signal.getsignal(signal.SIGALRM)
    signals.install()
    try:
        with pytest.raises(signals.Interrupted) as info:
            obj: object = _InterruptedInFinaliser()
            del obj  # the finaliser swallows the first raise
            signal.sigtimedwait([], 2.0)  # the redelivery lands here, in ordinary code
        assert info.value.signum == signal.SIGINT
        assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)


def test_other_unraisable_exceptions_reach_the_previous_hook(
    saved_handlers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(signals, "_previous_hook", lambda u: seen.append(u.exc_type))
    signals.install()

    class Broken:
        def __del__(self) -> None:
            raise ValueError("boom")

    obj: object = Broken()
    del obj
    assert seen == [ValueError]
