"""``rc whoami`` and the ``rc run --as`` check against a live controller (EXT-WHO-4)."""

from __future__ import annotations

from typing import Any

import pytest

from cli.conftest import Rc
from client.live import CLIENT, FakeWorker, LiveController
from resource_controller.client import api


@pytest.fixture
def env(controller: LiveController) -> dict[str, str]:
    return {"RC_CONTROLLER": controller.url, "RC_TOKEN": CLIENT, "RC_SUBMITTER": "tester"}


def test_whoami_prints_the_role(run_rc: Rc, env: dict[str, str]) -> None:
    result = run_rc("whoami", env=env)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "role: client\n", "")


@pytest.fixture
def whoami_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = api.JsonClient.whoami

    def spy(self: api.JsonClient, **kw: Any) -> Any:
        calls.append(1)
        return real(self, **kw)

    monkeypatch.setattr(api.JsonClient, "whoami", spy)
    return calls


def test_plain_run_asks_nothing_more(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, whoami_calls: list[int]
) -> None:
    # `rc run` is on the hot path: the whoami request is made only for --as.
    result = run_rc("run", "-d", "box:gpu0", "--", "true", env=env)
    assert result.exit_code == 0, result.stderr
    assert whoami_calls == []


def test_run_as_with_an_unnamed_token_asks_once_and_says_nothing(
    run_rc: Rc, env: dict[str, str], worker: FakeWorker, whoami_calls: list[int]
) -> None:
    result = run_rc("run", "--as", "bob", "-d", "box:gpu0", "--", "true", env=env)
    assert result.exit_code == 0, result.stderr
    assert whoami_calls == [1]
    assert result.stderr.count("\n") == 1  # only the job announcement
