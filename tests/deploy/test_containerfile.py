"""``deploy/Containerfile``: what the image promises, checked against the real CLI.

Building the image needs a container engine and a registry for the base image, which
CI does not have; the wheel it installs is built and installed for real by
``tests/e2e/test_wheel_install.py``. Here: the command it runs parses as ``rc serve``
with the flags it gives, the data path is the volume, the port is the one exposed,
the user is not root, and what it copies exists.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from resource_controller.cli.serve import serve

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def _one(word: str) -> str:
    found = [rest for w, rest in _final_stage() if w == word]
    assert len(found) == 1, f"{word}: {found}"
    return found[0]


def test_the_image_runs_rc_serve_with_flags_the_cli_accepts() -> None:
    entrypoint = json.loads(_one("ENTRYPOINT"))
    cmd = json.loads(_one("CMD"))
    assert entrypoint == ["/opt/resource-controller/bin/rc"]
    assert cmd[0] == "serve"
    ctx = serve.make_context("serve", list(cmd[1:]))
    assert isinstance(ctx, click.Context)
    assert str(ctx.params["data"]) == "/data"
    assert json.loads(_one("VOLUME")) == ["/data"]
    port = ctx.params["addr"].rpartition(":")[2]
    assert ctx.params["addr"] == f":{port}", "listen on every interface inside the container"
    assert _one("EXPOSE") == port
    assert f"127.0.0.1:{port}/healthz" in _one("HEALTHCHECK")


def test_the_image_runs_as_a_user_of_its_own() -> None:
    user = _one("USER")
    assert user not in {"root", "0"} and user
    assert any(
        w == "RUN" and "useradd" in rest and f" {user}" in rest for w, rest in _final_stage()
    )
    assert any(w == "RUN" and f"chown {user}:{user} /data" in rest for w, rest in _final_stage())


def test_the_base_is_a_slim_python_and_the_copied_sources_exist() -> None:
    bases = [rest.split()[0] for word, rest in _instructions() if word == "FROM"]
    assert bases and all(b.startswith("python:3.") and b.endswith("-slim") for b in bases)
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from="):
            *sources, _dest = shlex.split(rest)
            for source in sources:
                assert (ROOT / source).exists(), source
    # The install is the wheel, as a user would do it, never an editable checkout.
    assert any(
        w == "RUN" and "pip install" in rest and ".whl" in rest for w, rest in _final_stage()
    )


def _docker_run(lines: list[str]) -> list[str]:
    """The one ``docker run`` command among ``lines``, continuations joined, split as sh would."""
    joined = "\n".join(lines).replace("\\\n", " ")
    found = [ln for ln in joined.splitlines() if ln.strip().startswith("docker run ")]
    assert len(found) == 1, found
    return shlex.split(found[0])


def test_the_example_run_keeps_tokens_off_the_command_line_and_publishes_on_loopback() -> None:
    header = [
        ln.removeprefix("#").strip()
        for ln in CONTAINERFILE.read_text().splitlines()
        if ln.startswith("#")
    ]
    doc = (ROOT / "docs" / "install.md").read_text()
    section = doc[doc.index("## 7. The controller in a container") :]
    section = section[: section.index("\n## ", 1)]
    ours = _docker_run(header)
    # The same command in both places (docs/install.md is the fuller account).
    assert ours == _docker_run(section.splitlines())
    published = [ours[i + 1] for i, arg in enumerate(ours) if arg in ("-p", "--publish")]
    assert published and all(p.startswith("127.0.0.1:") for p in published), published
    assert not any(arg in ("-e", "--env") or arg.startswith("--env=") for arg in ours), ours
    env_file = ours[ours.index("--env-file") + 1]
    assert f"install -m 0600 /dev/null {env_file}" in "\n".join(header)
