"""docs/agents.md tells the truth about exit codes and error codes.

The error-code table must list exactly the codes the code can answer (every ``code``
of the error tree, every ``code=`` given to one, every literal the app answers with),
each with its HTTP status; the exit-code table must hold every exit status the
command line uses. Where the specification is found beside the checkout, every
documented code must be one it defines.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from resource_controller import errors
from resource_controller.cli import common, jobs, run
from resource_controller.client import calls, machine

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "agents.md"
SRC = ROOT / "src" / "resource_controller"


def _table(marker: str) -> list[list[str]]:
    """The rows of the table that follows ``<!-- marker``: cells, stripped, header dropped."""
    text = DOC.read_text()
    start = text.index(f"<!-- {marker}")
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert len(rows) > 2, f"no table after {marker}"
    return rows[2:]  # drop the header and the |---| line


def _documented_codes() -> dict[str, int]:
    found: dict[str, int] = {}
    for row in _table("error-codes"):
        code = re.fullmatch(r"`([a-z_]+)`", row[0])
        assert code is not None, row
        assert code.group(1) not in found, f"{code.group(1)} listed twice"
        found[code.group(1)] = int(row[1])
        assert row[2] and row[3], f"{row[0]}: say what it means and what to do"
    return found


def _codes_in_the_code() -> tuple[set[str], dict[str, int]]:
    """Every machine code the project can put in an error body, and the statuses known.

    A code given as ``code="..."`` to a helper (``deps.read_capped(..., code=...)``)
    has no class in sight; its status is then checked against the specification only.
    """
    statuses: dict[str, int] = {}
    by_name: dict[str, type[errors.RcError]] = {}
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.RcError):
            by_name[cls.__name__] = cls
            # The client's side of them has no status; a class that only narrows its
            # parent's meaning (StoreUnavailable) answers the parent's code and status.
            if not issubclass(cls, errors.ClientError) and "code" in vars(cls):
                statuses[cls.code] = cls.status
    codes = set(statuses)
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        codes |= set(re.findall(r"\bcode=\"(\w+)\"", text))
        # errors.TooLarge("...", code="sheet_too_large"), errors.DeviceNotFound(..., code=...)
        for cls_name, code in re.findall(
            r"errors\.(\w+)\((?:[^()]|\([^()]*\))*?code=\"(\w+)\"", text
        ):
            statuses[code] = by_name[cls_name].status
        # error_response("unauthorized", "...", 401) in the app's handlers
        for code, status in re.findall(r"error_response\(\s*\"(\w+)\",[^()]*?,\s*(\d+)\)", text):
            statuses[code] = int(status)
    return codes | set(statuses), statuses


def test_every_error_code_in_the_code_is_documented_and_nothing_else() -> None:
    in_code, statuses = _codes_in_the_code()
    documented = _documented_codes()
    # The scan sees the codes it must: one from each way of producing one.
    assert {"not_found", "device_not_found", "chunk_too_large", "unauthorized"} <= in_code
    assert sorted(in_code - documented.keys()) == [], "undocumented codes"
    assert sorted(documented.keys() - in_code) == [], "documented codes the code lacks"
    assert {c: documented[c] for c in statuses} == statuses, "statuses differ"


def _spec_catalogue() -> str | None:
    for parent in ROOT.parents:
        candidate = parent / "shared" / "spec" / "controller-api.md"
        if candidate.is_file():
            return candidate.read_text() + (candidate.parent / "extensions.md").read_text()
    return None


def test_every_documented_code_is_one_the_specification_defines() -> None:
    spec = _spec_catalogue()
    if spec is None:
        pytest.skip("the specification is not beside this checkout")
    for code, status in _documented_codes().items():
        assert f"`{code}`" in spec, code
        row = re.search(rf"^\| `{code}` \| (\d+) \|", spec, re.MULTILINE)
        if row is not None:  # the catalogue; stale_lease is given in prose (EXT-EPOCH-3)
            assert int(row.group(1)) == status, code


def _documented_exit_codes() -> set[str]:
    return {row[0].strip("`") for row in _table("exit-codes")}


def test_the_exit_code_table_covers_what_the_command_line_does() -> None:
    documented = _documented_exit_codes()
    assert documented == {"0", "1", "75", "130", "job's code"}
    assert run.EXIT_INTERRUPTED == jobs.EXIT_INTERRUPTED == machine.EXIT_INTERRUPTED == 130
    assert run.EXIT_LOST == machine.EXIT_LOST == 75  # contact lost: rc run, rc hold
    assert common.Failure.exit_code == 1
    # The job's code as the OS presents it; a multiple of 256 never reads as success.
    assert [calls.exit_status(n) for n in (3, -1, 137, 256, 512)] == [3, 255, 137, 1, 1]
    # Every literal exit status in the command line is one of the table's.
    literal = set()
    for path in [*(SRC / "cli").glob("*.py"), SRC / "client" / "machine.py"]:
        text = path.read_text()
        literal |= set(re.findall(r"(?:SystemExit|_exit|ctx\.exit|sys\.exit)\((\d+)\)", text))
        literal |= set(re.findall(r"EXIT_\w+ = (\d+)", text))
        literal |= set(re.findall(r"exit_code = (\d+)", text))
    assert literal, "the scan found no exit status at all"
    assert literal <= documented, literal - documented


SKILL = ROOT / "skills" / "resource-controller" / "SKILL.md"


def test_the_skill_file_has_front_matter_with_name_and_description() -> None:
    import yaml

    text = SKILL.read_text()
    assert text.startswith("---\n")
    front, _, body = text[4:].partition("\n---\n")
    meta = yaml.safe_load(front)
    assert meta["name"] == SKILL.parent.name
    assert isinstance(meta["description"], str) and len(meta["description"]) > 40
    assert "rc run" in body and "rc kill" in body


def _all_options() -> set[str]:
    import click

    from resource_controller.cli import main

    ctx = click.Context(main.rc)
    opts = {o for p in main.rc.params for o in getattr(p, "opts", [])}
    for name in main.rc.list_commands(ctx):
        command = main.rc.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            opts |= set(param.opts) | set(param.secondary_opts)
    return opts


@pytest.mark.parametrize("doc", [DOC, SKILL], ids=lambda p: p.name)
def test_every_flag_the_agent_docs_name_exists(doc: Path) -> None:
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", doc.read_text()))
    assert named, "the scan found no flag"
    assert sorted(named - _all_options()) == []
