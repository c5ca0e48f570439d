"""Interactive relay figures on loopback: keystroke round trip and ``rc cp`` throughput.

Starts a real ``rc serve`` and one ``rc worker`` (one device), then measures:

* keystroke round trip: ``rc run --tty -- sh -c 'stty raw -echo; exec cat'`` under a
  PTY of the benchmark's own; one byte typed, the time until it comes back (through
  rc, the controller, the worker, the job's PTY and ``cat``, and all the way back),
  beside the same ``cat`` on a local PTY;
* ``rc cp`` throughput, upload and download of one file, beside ``cp`` of the same
  file on this machine.

Figures are min/median/max over repeats, in the same run as their baselines.
Usage: ``python bench/tty.py [--keys 200] [--copies 5] [--mib 50] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import termios
import time
import urllib.request
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
RC = str(BIN / "rc")
HOST = "benchbox"
DEV = f"{HOST}:slot0"
RAW_CAT = ["sh", "-c", "stty raw -echo; echo ready; exec cat"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "n": len(samples),
    }


class Fleet:
    """A controller and one worker with one device, stopped by PID on exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Fleet:
        env = dict(os.environ, RC_TOKENS="wtok:worker,ctok:client")
        self.procs.append(
            subprocess.Popen(
                [RC, "serve", "--addr", f"127.0.0.1:{self.port}", "--data", str(self.tmp / "d")],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(self.tmp / "controller.log", "wb"),
            )
        )
        self._wait(lambda: self.get("/v1/state") is not None, "controller")
        cfg = self.tmp / "worker.yaml"
        cfg.write_text(
            f"controller_url: {self.url}\ntoken: wtok\nhost: {HOST}\n"
            f"state_dir: {self.tmp / 'ws'}\ndevices: [slot0]\n"
        )
        self.procs.append(
            subprocess.Popen(
                [RC, "worker", "-c", str(cfg)],
                stdout=subprocess.DEVNULL,
                stderr=open(self.tmp / "worker.log", "wb"),
            )
        )
        self._wait(lambda: len(self.get("/v1/devices") or []) == 1, "worker")
        return self

    def __exit__(self, *_: object) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()

    def get(self, path: str) -> Any:
        req = urllib.request.Request(self.url + path, headers={"Authorization": "Bearer ctok"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def _wait(self, ok: Any, what: str) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if ok():
                return
            time.sleep(0.05)
        raise SystemExit(f"{what} did not come up; see {self.tmp}")

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            RC_CONTROLLER=self.url,
            RC_TOKEN="ctok",
            RC_SUBMITTER="bench",
            RC_CONFIG=str(self.tmp / "none.yaml"),
        )


def _ctty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _read_until(fd: int, marker: bytes, timeout: float = 30) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {marker!r}: saw {seen[-200:]!r}")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            seen += os.read(fd, 65536)
    return seen


def keystrokes(argv: list[str], env: dict[str, str] | None, keys: int) -> tuple[list[float], str]:
    """Round trips of single bytes through ``argv`` on a fresh PTY; and rc's job ID."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
        preexec_fn=_ctty,
    )
    os.close(slave)
    try:
        seen = _read_until(master, b"ready")
        _, _, after = seen.partition(b"rc: job ")
        job_id = after.split(b" ", 1)[0].decode() if after else ""
        time.sleep(0.5)  # let the remote stty settle before timing
        samples = []
        for i in range(keys):
            key = bytes([ord("a") + i % 26])
            t0 = time.perf_counter()
            os.write(master, key)
            got = b""
            while key not in got:
                ready, _, _ = select.select([master], [], [], 10)
                if not ready:
                    raise SystemExit("a keystroke never came back")
                got += os.read(master, 4096)
            samples.append(time.perf_counter() - t0)
            time.sleep(0.01)
        return samples, job_id
    finally:
        proc.kill()
        proc.wait(10)
        os.close(master)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def copies(fleet: Fleet, tmp: Path, repeats: int, mib: int) -> dict[str, Any]:
    src = tmp / "payload.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for i in range(mib):
            f.write(block[i:] + block[:i])
    size_mb = src.stat().st_size / 1e6
    env = fleet.env()
    up, down, local = [], [], []
    for i in range(repeats):
        remote = tmp / f"remote{i}"
        up.append(size_mb / timed([RC, "cp", str(src), f"{DEV}:{remote}/"], env))
        back = tmp / f"back{i}.bin"
        down.append(size_mb / timed([RC, "cp", f"{DEV}:{remote}/payload.bin", str(back)], env))
        if back.read_bytes() != src.read_bytes():
            raise SystemExit("the copy came back different")
        local.append(size_mb / timed(["cp", str(src), str(tmp / f"local{i}.bin")]))
        shutil.rmtree(remote)
        for p in (back, tmp / f"local{i}.bin"):
            p.unlink()
    return {
        "file_mb": size_mb,
        "rc_cp_upload_mb_s": summary(up),
        "rc_cp_download_mb_s": summary(down),
        "local_cp_mb_s": summary(local),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--copies", type=int, default=5)
    ap.add_argument("--mib", type=int, default=50)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rc-bench-tty-") as d:
        tmp = Path(d)
        with Fleet(tmp) as fleet:
            local, _ = keystrokes(RAW_CAT, None, args.keys)
            argv = [RC, "run", "-d", DEV, "--tty", "--", *RAW_CAT]
            remote, job_id = keystrokes(argv, fleet.env(), args.keys)
            # rc was killed, not the job (a lost terminal never frees a device): end it.
            subprocess.run([RC, "kill", job_id], env=fleet.env(), check=True, capture_output=True)
            fleet._wait(
                lambda: (fleet.get("/v1/devices") or [{}])[0].get("holder") is None, "the device"
            )
            results: dict[str, Any] = {
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
                "keystroke_rc_tty_s": summary(remote),
                "keystroke_local_pty_s": summary(local),
                "keystroke_ratio": statistics.median(remote) / statistics.median(local),
            }
            results.update(copies(fleet, tmp, args.copies, args.mib))
    for name, value in results.items():
        if isinstance(value, dict) and name.startswith("keystroke_"):
            print(
                f"{name}: median {value['median'] * 1e3:.2f} ms"
                f" (min {value['min'] * 1e3:.2f}, max {value['max'] * 1e3:.2f}, n={int(value['n'])})"
            )
        elif isinstance(value, dict):
            print(
                f"{name}: median {value['median']:.1f} (min {value['min']:.1f},"
                f" max {value['max']:.1f}, n={int(value['n'])})"
            )
        else:
            print(f"{name}: {value if not isinstance(value, float) else round(value, 2)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
