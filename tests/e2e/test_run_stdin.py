"""``rc run -i``: stdin forwarded to the job over pipe mode; without it, never read."""

from __future__ import annotations

import subprocess

from .cluster import RC, Cluster


def run_with_stdin(c: Cluster, data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [RC, "run", "-d", c.dev, *args], input=data, env=c.env(), capture_output=True, timeout=60
    )


def test_piped_stdin_reaches_the_job_and_its_output_comes_back(box: Cluster) -> None:
    r = run_with_stdin(box, b"data\n", "-i", "--", "cat")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"data\n"
    payload = bytes(range(256)) * 2000
    r = run_with_stdin(box, payload, "-i", "--", "sh", "-c", "cat; exit 7")
    assert r.returncode == 7, r.stderr
    assert r.stdout == payload  # byte exact: no terminal in between


def test_without_i_stdin_is_not_read(box: Cluster) -> None:
    r = run_with_stdin(box, b"data\n", "--", "cat")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b""  # the job's stdin is /dev/null


def test_i_and_tty_together_are_refused_and_help_says_stdin_is_not_read() -> None:
    r = subprocess.run([RC, "run", "-i", "--tty", "--", "cat"], capture_output=True, text=True)
    assert r.returncode == 1 and "-i and --tty" in r.stderr
    help_text = subprocess.run([RC, "run", "--help"], capture_output=True, text=True).stdout
    assert "-i, --interactive" in help_text
    assert "stdin is not read" in " ".join(help_text.split())
