"""``rc serve --help`` and docs/install.md name every webhook kind the controller raises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resource_controller.controller import webhooks

from .conftest import Rc

INSTALL = Path(__file__).resolve().parents[2] / "docs" / "install.md"


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z_]+(?:\.[a-z_]+)?", text))


def test_the_controller_has_the_seven_kinds() -> None:  # API-104, and EXT-PREEMPT-3's
    assert len(set(webhooks.KINDS)) == 8
    assert webhooks.DEVICE_RECOVERED in webhooks.KINDS


@pytest.mark.parametrize("kind", webhooks.KINDS)
def test_each_webhook_kind_is_in_the_serve_help_and_the_install_doc(run_rc: Rc, kind: str) -> None:
    # API-104
    result = run_rc("serve", "--help")
    assert result.exit_code == 0, result.stderr
    assert kind in _words(result.stdout), f"rc serve --help does not name {kind}"
    assert kind in _words(INSTALL.read_text()), f"docs/install.md does not name {kind}"
