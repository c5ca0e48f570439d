"""The pages ``rc`` prints without click are click's own, byte for byte (issue 14).

``cli/pages.py`` holds help pages rendered beforehand; these tests render each again
with click, in a process of its own as ``rc`` would, and compare. A help text edited
without rewriting the file (``python -m resource_controller.cli.pagegen``) fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resource_controller.cli import main, pagegen, pages

RC = Path(sys.executable).parent / "rc"

ALL_ARGV = sorted(main.PAGE_ARGV) + sorted(main.VERSION_ARGV)


def rc(argv: list[str], **env: str) -> subprocess.CompletedProcess[bytes]:
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "_RC_COMPLETE")}
    return subprocess.run(
        [str(RC), *argv], env={**environ, **env}, capture_output=True, timeout=60, check=False
    )


@pytest.mark.parametrize("name", sorted(pagegen.SOURCES))
def test_each_stored_page_is_what_click_renders_now(name: str) -> None:
    assert pages.PAGES[name] == pagegen.render(pagegen.SOURCES[name]), (
        "help text changed: run python -m resource_controller.cli.pagegen"
    )


def test_every_served_page_has_a_source() -> None:
    assert set(main.PAGE_ARGV.values()) == set(pagegen.SOURCES) == set(pages.PAGES)


@pytest.mark.parametrize("argv", ALL_ARGV, ids=" ".join)
def test_rc_prints_what_click_prints(argv: tuple[str, ...]) -> None:
    done = rc(list(argv))
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert done.stdout.decode() == pagegen.render(list(argv))


@pytest.mark.parametrize("argv", [["--help"], ["-h"]], ids=" ".join)
def test_a_narrow_terminal_gets_clicks_layout_for_its_width(argv: list[str]) -> None:
    done = rc(argv, COLUMNS="60")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == pagegen.render(argv, columns=60)


def test_a_wide_terminal_gets_the_stored_page() -> None:
    done = rc(["help"], COLUMNS="200")
    assert done.stdout.decode() == pages.PAGES["rc"]


def test_the_stored_page_needs_no_click() -> None:
    code = (
        "import sys\n"
        "sys.argv = ['rc', '--help']\n"
        "from resource_controller.cli import main\n"
        "try:\n"
        "    main.main()\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = ('click', 'typing', 'dataclasses', 'inspect', 'shutil', 're')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy), file=sys.stderr)"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout == pages.PAGES["rc"]
    assert done.stderr.strip() == "[]"


@pytest.mark.parametrize("argv", [["--help"], ["--version"]], ids=" ".join)
def test_a_closed_pipe_exits_1_quietly_as_click_does(argv: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [str(RC), *argv],
            stdout=write,
            capture_output=False,
            timeout=60,
            stderr=subprocess.PIPE,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, b"")


def test_shell_completion_still_goes_to_click() -> None:
    done = rc(["--help"], _RC_COMPLETE="bash_source")
    assert done.returncode == 0
    assert b"complete" in done.stdout and b"Usage:" not in done.stdout
