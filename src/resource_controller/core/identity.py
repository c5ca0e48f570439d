"""Who is calling, and which jobs a caller may end (EXT-WHO): a named client token owns its name."""

from __future__ import annotations

import re
from dataclasses import dataclass

from resource_controller.core.states import Role

#: A token's name: 1-64 characters of ``A-Z a-z 0-9 . _ @ / -``.
NAME_MAX = 64
_NAME = re.compile(r"[A-Za-z0-9._@/-]{1,64}")


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def as_name(text: str) -> str | None:
    """``text`` made into a valid name: other characters become ``_``, cut to 64;
    None when nothing is left (``rc up`` names its client token after the user)."""
    name = re.sub(r"[^A-Za-z0-9._@/-]", "_", text)[:NAME_MAX]
    return name or None


@dataclass(frozen=True)
class Caller:
    """The identity a bearer token grants: its role and, optionally, its name."""

    role: Role
    name: str | None = None

    @property
    def admin(self) -> bool:
        return self.role == Role.ADMIN

    @property
    def owner(self) -> str | None:
        """The name this caller owns, if any: only a named client token owns one."""
        return self.name if self.role == Role.CLIENT else None


def under(name: str, submitter: str) -> bool:
    """True when ``submitter`` is ``name`` or ``name`` followed by ``@`` or ``/`` and more
    (``alice``, ``alice@host``, ``alice/session``; not ``alicex``)."""
    if submitter == name:
        return True
    return submitter.startswith(name) and submitter[len(name) : len(name) + 1] in ("@", "/")


def recorded_submitter(caller: Caller, asserted: str) -> str:
    """The submitter a submit (or a kill's reason) records: a named client token's assertion only
    when under its name; a named admin's assertion (it submits on behalf of others) or its name."""
    owner = caller.owner
    if owner is not None:
        return asserted if under(owner, asserted) else owner
    if caller.admin and caller.name and not asserted:
        return caller.name
    return asserted


def share_name(caller: Caller, recorded: str) -> str:
    """The name a submit's limit counts under: a named client token's, else the submitter."""
    return caller.owner or recorded


def may_end(caller: Caller, job_submitter: str, asserted: str) -> bool:
    """Whether ``caller`` may end a job of ``job_submitter``: an admin always; a named client its
    name's; another client when the assertion matches (API-046: an accident guard, not
    authentication)."""
    if caller.admin:
        return True
    owner = caller.owner
    if owner is not None:
        return under(owner, job_submitter)
    return asserted == job_submitter
