"""``rc up``'s in-process RC_TOKENS: the client token carries the user's name (EXT-WHO-4)."""

from __future__ import annotations

import pytest

from resource_controller.controller.auth import parse_tokens
from resource_controller.core.identity import Caller
from resource_controller.core.states import Role
from resource_controller.local import tokens_env

TOKENS = {"worker": "W", "client": "C", "admin": "A"}


def test_client_token_is_named_after_the_user() -> None:
    assert parse_tokens(tokens_env(TOKENS, "alice")) == {
        "W": Caller(Role.WORKER),
        "C": Caller(Role.CLIENT, "alice"),
        "A": Caller(Role.ADMIN),
    }


def test_user_name_is_made_valid() -> None:
    assert parse_tokens(tokens_env(TOKENS, "john doe:x"))["C"] == Caller(Role.CLIENT, "john_doe_x")


def test_no_user_means_no_name() -> None:
    assert parse_tokens(tokens_env(TOKENS, ""))["C"] == Caller(Role.CLIENT)


def test_user_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same $USER the CLI's derived submitter starts with (CLI-030), so a plain
    # `rc run` under `rc up` records `<user>@<host>` unchanged.
    monkeypatch.setenv("USER", "carol")
    assert parse_tokens(tokens_env(TOKENS))["C"] == Caller(Role.CLIENT, "carol")
