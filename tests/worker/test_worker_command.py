"""``rc worker`` on the command line: the config path it hands to the process (§1)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from resource_controller.cli.group import rc
from resource_controller.worker import process


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "/etc/rc/worker.yaml"),
        (["--config", "/srv/w.yaml"], "/srv/w.yaml"),
        (["-c", "/srv/w.yaml"], "/srv/w.yaml"),
    ],
)
def test_config_path_defaults_to_etc_and_the_option_passes_it(
    monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:  # WRK-001
    given: list[str] = []

    def main(config_path: str, log_format: str = "text") -> int:
        given.append(config_path)
        return 0

    monkeypatch.setattr(process, "main", main)
    result = CliRunner().invoke(rc, ["worker", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert given == [expected]
