"""``rc``'s entry point: importing click is costly, so help, version and ``rc run`` avoid it.

The pre-rendered pages (``cli/pages.py``) are used only at the width they were rendered for.
"""

from __future__ import annotations

import os
import sys

from resource_controller import heap
from resource_controller.cli import signals

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any

#: The terminal width the pages were rendered for: click lays help out at
#: ``min(columns, 80) - 2``, so any width of at least 80 gives the same page.
PAGE_COLUMNS = 80

#: argv -> the page it prints (a key of ``pages.PAGES``).
PAGE_ARGV: dict[tuple[str, ...], str] = {("--help",): "rc", ("-h",): "rc", ("help",): "rc"}
VERSION_ARGV = frozenset({("--version",), ("version",)})


def terminal_columns() -> int:
    """As ``shutil.get_terminal_size`` finds it, without importing ``shutil``."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or PAGE_COLUMNS
    return columns


def ready_page(argv: list[str]) -> str | None:
    """The text ``rc`` prints for ``argv`` when it needs no parser, else None."""
    key = tuple(argv)
    if key in VERSION_ARGV:
        from resource_controller import version

        return f"rc {version.installed_version()}\n"
    name = PAGE_ARGV.get(key)
    if name is None or terminal_columns() < PAGE_COLUMNS:
        return None
    from resource_controller.cli import pages

    return pages.PAGES[name]


def _print_page(text: str) -> None:
    from resource_controller.cli import exits, render

    try:
        render.out(text)
    except OSError as e:
        exits.os_error_in_command(e)  # as click ends a page it could not write
    exits.leave(0)


def main() -> None:
    heap.hold()  # until the command's imports are done (cli/run.py, below)
    signals.install()
    argv = sys.argv[1:]
    if "_RC_COMPLETE" not in os.environ:  # shell completion is click's
        page = ready_page(argv)
        if page is not None:
            _print_page(page)
        if argv[:1] == ["run"] or argv == ["help", "run"]:
            from resource_controller.cli import run

            run.main(argv[1:] if argv[0] == "run" else ["--help"])
    from resource_controller.cli import group

    heap.release()
    group.rc.main(prog_name="rc")


def __getattr__(name: str) -> Any:
    """The click group's names (``rc``, ``COMMANDS``, ...), loaded on first access."""
    if name.startswith("__"):
        raise AttributeError(name)
    from resource_controller.cli import group

    return getattr(group, name)
