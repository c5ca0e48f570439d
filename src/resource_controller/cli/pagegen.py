"""Render the help pages ``rc`` prints without click (``cli/pages.py``), with click.

Run ``python -m resource_controller.cli.pagegen`` after changing any help text that
``main.PAGE_ARGV`` serves; ``tests/cli/test_pages.py`` fails until the file is rewritten.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from resource_controller.cli import main

#: One argv per page: what click is asked to render it from.
SOURCES = {"rc": ["--help"]}


def render(argv: list[str], columns: int = main.PAGE_COLUMNS) -> str:
    """In a process of its own: click's ``CliRunner`` would force its own width."""
    import subprocess

    code = f"from resource_controller.cli import group; group.rc.main({argv!r}, prog_name='rc')"
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("_RC_COMPLETE", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rc {' '.join(argv)} exited {done.returncode}: {done.stderr!r}")
    return done.stdout.decode("utf-8")


def source() -> str:
    """The text of ``cli/pages.py`` for the current help pages."""
    lines = [
        '"""Help pages pre-rendered by click, printed by ``cli/main.py`` without importing it.',
        "",
        "Written by ``python -m resource_controller.cli.pagegen``; do not edit by hand",
        "(``tests/cli/test_pages.py`` compares every page with what click renders now).",
        '"""',
        "",
        "PAGES: dict[str, str] = {}",
    ]
    for name, argv in SOURCES.items():
        text = render(argv)
        lines.append(f"PAGES[{_literal(name)}] = (")
        lines.extend(f"    {_literal(line)}" for line in text.splitlines(keepends=True))
        lines.append(")")
    return "\n".join(lines) + "\n"


def _literal(line: str) -> str:
    """``line`` as a string literal in the quotes ``ruff format`` prefers (double)."""
    text = repr(line)
    if text.startswith("'") and '"' not in line:
        return '"' + text[1:-1] + '"'
    return text


#: The file this writes.
PAGES_FILE = Path(__file__).with_name("pages.py")


def write() -> None:
    """Rewrite ``cli/pages.py``."""
    PAGES_FILE.write_text(source(), encoding="utf-8")


if __name__ == "__main__":
    write()
    sys.stdout.write("rewrote cli/pages.py\n")
