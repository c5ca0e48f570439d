"""The examples in docs/install.md work as written: the worker config loads, the tokens
parse, and the files it points at exist."""

from __future__ import annotations

import re
from pathlib import Path

from resource_controller.controller.auth import parse_tokens
from resource_controller.core.states import Role
from resource_controller.worker.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "install.md").read_text()


def _block_after(marker: str, language: str) -> str:
    start = DOC.index(marker)
    fence = DOC.index(f"```{language}\n", start) + len(language) + 4
    return DOC[fence : DOC.index("```", fence)]


def test_the_worker_yaml_example_loads(tmp_path: Path) -> None:
    text = _block_after("`/etc/rc/worker.yaml`", "yaml")
    path = tmp_path / "worker.yaml"
    path.write_text(text.replace("<this host's worker token>", "wtok"))
    config = load_config(str(path), environ={})
    assert config.host == "gpubox1"
    assert config.state_dir == "/var/lib/rc-worker/gpubox1"
    assert [d.name for d in config.devices] == ["gpu0", "gpu1"]


def test_the_rc_tokens_example_parses_with_names() -> None:
    line = next(ln for ln in DOC.splitlines() if ln.startswith("RC_TOKENS=Wq"))
    tokens = parse_tokens(line.split("=", 1)[1])
    named = {c.name: c.role for c in tokens.values() if c.name}
    assert named == {
        "gpubox1": Role.WORKER,
        "gpubox2": Role.WORKER,
        "alice": Role.CLIENT,
        "ci": Role.CLIENT,
    }


def test_the_files_it_names_exist() -> None:
    for path in set(re.findall(r"`((?:deploy|docs|skills|tests)/[\w./@-]+)`", DOC)):
        assert (ROOT / path).exists(), path
    for unit in ("rc-serve.service", "rc-worker.service"):
        assert (ROOT / "deploy" / "systemd" / unit).is_file()


def _shell_lines() -> list[str]:
    """Every command line of the page's ``sh`` blocks, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", DOC, flags=re.S):
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if command:
                lines.append(command)
    return lines


def test_nothing_is_pip_installed_into_the_system_python() -> None:
    # PEP 668: a distribution's Python refuses pip outside a virtual environment, so
    # every install goes through a venv's own pip, and python3 only makes venvs.
    lines = _shell_lines()
    assert any("bin/python -m build" in line for line in lines)
    for line in lines:
        for command in re.split(r"&&|\|\||;|\|", line):
            words = command.split()
            if words[:1] == ["sudo"]:
                words = words[1:]
            if not words:
                continue
            assert words[0] not in ("pip", "pip3"), line
            if words[0] in ("python", "python3") and words[1:2] == ["-m"]:
                assert words[2] == "venv", line
