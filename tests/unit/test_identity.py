"""The ownership rule of named tokens (EXT-WHO-1, EXT-WHO-2) and the base (API-046)."""

from __future__ import annotations

import pytest

from resource_controller.core.identity import (
    Caller,
    as_name,
    may_end,
    recorded_submitter,
    under,
    valid_name,
)
from resource_controller.core.states import Role

ALICE = Caller(Role.CLIENT, "alice")
CLIENT = Caller(Role.CLIENT)
ADMIN = Caller(Role.ADMIN)
NAMED_ADMIN = Caller(Role.ADMIN, "ops")


@pytest.mark.parametrize(
    ("submitter", "expected"),
    [
        ("alice", True),
        ("alice@host", True),
        ("alice/session", True),
        ("alice@host/3f9c2a", True),
        ("alice@", True),  # the name followed by "@": nothing more is required
        ("alice/", True),
        ("alicex", False),
        ("alice.x", False),
        ("alice-x", False),
        ("alic", False),
        ("bob", False),
        ("bob@alice", False),
        ("xalice", False),
        ("Alice", False),  # case-sensitive
        ("", False),
        (" alice", False),
    ],
)
def test_under(submitter: str, expected: bool) -> None:
    # EXT-WHO-2: the name, or the name followed by "@" or "/".
    assert under("alice", submitter) is expected


@pytest.mark.parametrize(
    ("asserted", "recorded"),
    [
        ("alice", "alice"),
        ("alice@host/sess", "alice@host/sess"),
        ("alice/sess", "alice/sess"),
        ("alicex", "alice"),
        ("bob", "alice"),
        ("bob@host", "alice"),
        ("", "alice"),
    ],
)
def test_named_client_submits_under_its_name(asserted: str, recorded: str) -> None:
    # EXT-WHO-2: kept only when under the name; anything else, or none, is the name.
    assert recorded_submitter(ALICE, asserted) == recorded


@pytest.mark.parametrize("asserted", ["bob", "alice", "", "anything@else"])
def test_unnamed_tokens_record_the_assertion(asserted: str) -> None:
    # AUTH-005, EXT-WHO-1: without a name nothing changes.
    assert recorded_submitter(CLIENT, asserted) == asserted
    assert recorded_submitter(ADMIN, asserted) == asserted


def test_named_admin_keeps_the_override() -> None:
    # EXT-WHO-2 "admin tokens keep the override": the assertion stands; the name only
    # fills in for a missing one.
    assert recorded_submitter(NAMED_ADMIN, "bob") == "bob"
    assert recorded_submitter(NAMED_ADMIN, "") == "ops"


def test_named_worker_owns_no_submitter() -> None:
    # Only a client token owns its name (EXT-WHO-2); a worker token never submits.
    assert recorded_submitter(Caller(Role.WORKER, "box"), "bob") == "bob"


@pytest.mark.parametrize(
    ("job_submitter", "asserted", "allowed"),
    [
        ("alice", "alice", True),
        ("alice@host/sess", "", True),
        ("alice/x", "bob", True),  # whatever the body asserts
        ("alicex", "alicex", False),
        ("bob", "bob", False),  # the body cannot claim another's job
        ("bob", "alice", False),
        ("", "", False),
    ],
)
def test_named_client_ends_only_its_jobs(job_submitter: str, asserted: str, allowed: bool) -> None:
    # EXT-WHO-2: kill and release under a named client token.
    assert may_end(ALICE, job_submitter, asserted) is allowed


@pytest.mark.parametrize(
    ("job_submitter", "asserted", "allowed"),
    [
        ("alice", "alice", True),
        ("alice", "bob", False),
        ("alice@host", "alice", False),  # the base compares exactly
        ("", "", True),
    ],
)
def test_unnamed_client_compares_the_assertion(
    job_submitter: str, asserted: str, allowed: bool
) -> None:
    # API-046 step 2.
    assert may_end(CLIENT, job_submitter, asserted) is allowed


@pytest.mark.parametrize("caller", [ADMIN, NAMED_ADMIN])
def test_admin_may_end_anything(caller: Caller) -> None:
    # API-046 "an admin skips the check"; EXT-WHO-2 "admin tokens keep the override".
    assert may_end(caller, "bob", "")
    assert may_end(caller, "alice", "carol")


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("n" * 64, True),
        ("A-Z.a_z@0/9", True),
        ("", False),
        ("n" * 65, False),
        ("a b", False),
        ("a:b", False),
        ("a,b", False),
        ("a\n", False),
        ("é", False),
    ],
)
def test_valid_name(name: str, ok: bool) -> None:
    # EXT-WHO-1: 1-64 characters of A-Z a-z 0-9 . _ @ / -
    assert valid_name(name) is ok


@pytest.mark.parametrize(
    ("user", "name"),
    [
        ("alice", "alice"),
        ("john doe", "john_doe"),
        ("DOMAIN\\user", "DOMAIN_user"),
        ("jörg", "j_rg"),
        ("u" * 80, "u" * 64),
        ("", None),
    ],
)
def test_as_name(user: str, name: str | None) -> None:
    # EXT-WHO-4: rc up names its client token after the user, made valid.
    assert as_name(user) == name
    assert name is None or valid_name(name)
