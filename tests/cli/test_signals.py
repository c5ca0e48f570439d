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
