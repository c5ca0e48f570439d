"""Start-up cost of the ``rc`` client, beside the bare interpreter measured in the same run.

Times whole processes (fork, exec, interpreter start, imports, output, exit):
``rc --help``, ``rc --version``, ``rc run --help``, and, as baselines, ``python3 -c
pass`` and ``python3 -I -S -c pass`` (no ``site``: the interpreter's own floor), plus
``python3 -c 'import click'`` to show what the command-line library alone costs. The
commands are interleaved round-robin so that a noisy neighbour hits them all alike.
Figures are min/median/max in ms and the median's ratio to ``python3 -c pass``. No
controller is needed, except with ``--live``: that starts ``rc serve`` and ``rc worker``
(``latency.Fleet``: four devices on loopback) and also times the whole ``rc run -d
benchbox:slot0 -- true``. Usage: ``python bench/startup.py [--repeats 30] [--json
out.json] [--other-src DIR] [--live]``; ``--other-src`` times the same ``rc`` commands
again with ``DIR`` (another checkout's ``src``, byte-compiled) first on ``PYTHONPATH``,
in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from latency import HOST, Fleet

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
PY = sys.executable

#: label -> argv; the first is the baseline every ratio is taken against.
COMMANDS: dict[str, list[str]] = {
    "python3 -c pass": [PY, "-c", "pass"],
    "python3 -I -S -c pass": [PY, "-I", "-S", "-c", "pass"],
    "python3 -c 'import click'": [PY, "-c", "import click"],
    "rc --help": [RC, "--help"],
    "rc --version": [RC, "--version"],
    "rc run --help": [RC, "run", "--help"],
}


def timed(cmd: list[str], env: dict[str, str] | None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


#: The live row: one job on one named device, the hot path of issue 14.
RUN_LABEL = "rc run -d X -- true"
RUN_ARGV = [RC, "run", "-d", f"{HOST}:slot0", "--", "true"]


def plan(
    other_src: Path | None, live_env: dict[str, str] | None = None
) -> dict[str, tuple[list[str], dict[str, str] | None]]:
    """label -> (argv, environment); the other checkout's rows run its code instead."""
    rows: dict[str, tuple[list[str], dict[str, str] | None]] = {
        label: (cmd, None) for label, cmd in COMMANDS.items()
    }
    if live_env is not None:
        rows[RUN_LABEL] = (RUN_ARGV, live_env)
    if other_src is not None:
        env = dict(os.environ, PYTHONPATH=str(other_src.resolve()))
        for label, (cmd, base) in list(rows.items()):
            if cmd[0] == RC:
                rows[f"{label} [other]"] = (cmd, {**(base or os.environ), **env})
    return rows


def measure(
    repeats: int, other_src: Path | None, live_env: dict[str, str] | None = None
) -> dict[str, list[float]]:
    rows = plan(other_src, live_env)
    samples: dict[str, list[float]] = {label: [] for label in rows}
    for cmd, env in rows.values():  # warm the page cache
        timed(cmd, env)
    for _ in range(repeats):
        for label, (cmd, env) in rows.items():
            samples[label].append(timed(cmd, env))
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--other-src", type=Path, help="another checkout's src, timed alongside")
    ap.add_argument("--live", action="store_true", help="also time rc run against rc serve")
    args = ap.parse_args()
    if args.live:
        with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp)) as fleet:
            live_env = dict(os.environ, RC_CONTROLLER=fleet.url, RC_TOKEN="ctok")
            live_env["RC_SUBMITTER"] = "bench"
            live_env["RC_CONFIG"] = str(Path(tmp) / "absent-config.yaml")
            samples = measure(args.repeats, args.other_src, live_env)
    else:
        samples = measure(args.repeats, args.other_src)
    base = statistics.median(samples["python3 -c pass"])
    results = {}
    print(f"{'command':34} {'min':>7} {'median':>7} {'max':>7}  ratio (median / python3 -c pass)")
    for label, xs in samples.items():
        row = {
            "min_ms": min(xs) * 1e3,
            "median_ms": statistics.median(xs) * 1e3,
            "max_ms": max(xs) * 1e3,
            "n": len(xs),
            "ratio": statistics.median(xs) / base,
        }
        results[label] = row
        print(
            f"{label:34} {row['min_ms']:7.1f} {row['median_ms']:7.1f} {row['max_ms']:7.1f}"
            f"  {row['ratio']:.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
