"""Takeover: how long three controllers on one PostgreSQL database go without a leader
once the leader dies (SIGKILL) or freezes (SIGSTOP) (EXT-PG-8: at most 5 s).

Three ``rc serve`` and two workers (``bench/controllers.py``'s fleet); each round finds
the leader by ``/healthz``, signals it, and times until another's ``/healthz`` says
``leader`` (the others polled every 20 ms), signalled 1-2 s after the last takeover
so that the signal falls anywhere between two renewals. A killed leader is started again, a frozen one resumed
(SIGCONT), before the next round. A kill is seen at once (its server session ends); a
freeze only once its lease lapses, ``peers.LEASE`` after its last renewal, plus up to a
``peers.TICK``. Usage: ``python bench/failover.py [--rounds 10] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import pg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from controllers import Controllers, _get, _wait
from latency import summary


def _another_leads(ctl: Controllers, old: int) -> Callable[[], bool]:
    """Whether a controller but ``old`` says it leads; ``old`` is not asked (frozen, it
    would hold each round for the whole of a request's timeout)."""
    others = [url for i, url in enumerate(ctl.urls) if i != old]
    return lambda: any((_get(url, "/healthz") or {}).get("leader") for url in others)


def _answers(url: str) -> Callable[[], bool]:
    return lambda: _get(url, "/healthz") is not None


def takeovers(ctl: Controllers, sig: signal.Signals, rounds: int) -> dict[str, Any]:
    times = []
    phase = random.Random(sig)
    for _ in range(rounds):
        _wait(lambda: ctl.leader() is not None, "a leader")
        # Not at once: the leader took over a moment ago, and renewed its lease then.
        time.sleep(phase.uniform(1.0, 2.0))
        old = ctl.leader()
        assert old is not None
        victim = ctl.servers[old]
        assert victim is not None
        victim.send_signal(sig)
        if sig == signal.SIGKILL:
            victim.wait(10)
        times.append(_wait(_another_leads(ctl, old), "the takeover", 15))
        if sig == signal.SIGKILL:
            ctl.start(old)
        else:
            victim.send_signal(signal.SIGCONT)
            _wait(_answers(ctl.urls[old]), "the resumed controller to answer")
    return summary(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    cluster = pg.start()
    results: dict[str, Any] = {"machine": machine}
    try:
        with (
            tempfile.TemporaryDirectory(prefix="rc-bench-") as root,
            Controllers(Path(root), 3, cluster.fresh_database()) as ctl,
        ):
            for sig in (signal.SIGKILL, signal.SIGSTOP):
                results[sig.name] = takeovers(ctl, sig, args.rounds)
    finally:
        cluster.stop()
    print(f"machine: {machine}")
    for name in ("SIGKILL", "SIGSTOP"):
        t = results[name]
        print(
            f"takeover after {name}: median {t['median']:.2f} s (min {t['min']:.2f},"
            f" max {t['max']:.2f}, n={int(t['n'])})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
