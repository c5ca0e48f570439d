"""The browser tests' gate: skip on a machine without Chromium, fail in CI without it."""

from __future__ import annotations

import pytest

from . import browser


def test_missing_chromium_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="/nonexistent/chromium"):
        browser.require_browser()


def test_missing_chromium_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "CHROMEDRIVER", "/nonexistent/chromedriver")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="/nonexistent/chromedriver"):
        browser.require_browser()
