"""The fake ``nvidia-smi`` of ``tests/data/nvidia_smi`` for tests (EXT-MIG-4).

``FakeNvidiaSmi`` makes a ``bin`` directory whose ``nvidia-smi`` serves one of the
recorded scenarios, switchable between calls (``use``), and the environment that puts
it first on ``PATH``; processes started with that environment (``rc worker``, ``rc up``)
find it as they would the real one. ``answer`` serves the same recordings in-process,
for unit tests that inject a probe runner instead of starting processes.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

DATA = Path(__file__).resolve().parent.parent / "data" / "nvidia_smi"
SCRIPT = DATA / "nvidia-smi"

#: The probe's query (PROBE-010) and the sampling query (EXT-ACCT-1), as argv tails.
PROBE_ARGS = (
    "--query-gpu=name,memory.total,memory.free,driver_version",
    "--format=csv,noheader,nounits",
)
LIST_ARGS = ("-L",)


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("fake_nvidia_smi", str(SCRIPT))
    spec = importlib.util.spec_from_loader("fake_nvidia_smi", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


_FAKE = _load()


def scenarios() -> list[str]:
    """Every recorded scenario's name."""
    return sorted(p.name for p in DATA.iterdir() if p.is_dir())


def answer(scenario: str | Path, args: Sequence[str]) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) the fake gives for ``args`` in ``scenario``; no sleep."""
    got = _FAKE.serve(list(args), str(scenario))
    return got.stdout, got.stderr, got.code


def recorded(scenario: str, name: str) -> str:
    """A recording's printed text (its header left out)."""
    return str(_FAKE.recording(DATA / scenario / name).stdout)


class FakeNvidiaSmi:
    """A ``bin`` directory with the fake, serving a scenario a test can switch."""

    def __init__(self, tmp: Path, scenario: str) -> None:
        self.bindir = tmp / "fake-nvidia-bin"
        self.bindir.mkdir(parents=True, exist_ok=True)
        link = self.bindir / "nvidia-smi"
        if not link.exists():
            link.symlink_to(SCRIPT)
        self.path = link
        #: The symlink ``RC_FAKE_NVIDIA_SMI`` names; ``use`` repoints it.
        self.current = tmp / "fake-nvidia-scenario"
        self.log = tmp / "fake-nvidia-calls.log"
        self.use(scenario)

    def use(self, scenario: str) -> None:
        """Serve ``scenario`` from the next call on (the link is replaced atomically)."""
        fresh = self.current.with_name(self.current.name + ".new")
        if fresh.is_symlink():
            fresh.unlink()
        fresh.symlink_to(DATA / scenario)
        os.replace(fresh, self.current)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``PATH`` with the fake first, ``RC_FAKE_NVIDIA_SMI`` and the call log."""
        path = (base or os.environ).get("PATH", os.defpath)
        return {
            "PATH": f"{self.bindir}{os.pathsep}{path}",
            "RC_FAKE_NVIDIA_SMI": str(self.current),
            "RC_FAKE_NVIDIA_SMI_LOG": str(self.log),
        }

    def calls(self) -> list[str]:
        """The arguments of every call so far, one string each."""
        return self.log.read_text().splitlines() if self.log.exists() else []
