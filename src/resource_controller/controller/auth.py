"""Role tokens from ``RC_TOKENS`` and the bearer check (SRV-004..006, AUTH-001..004).

Tokens are compared in constant time and never logged. ``admin`` satisfies every
role; ``worker`` and ``client`` are disjoint.
"""

from __future__ import annotations

import hmac

from resource_controller.core.states import Role

EXAMPLE = "RC_TOKENS required, e.g. RC_TOKENS='wtok:worker,ctok:client,atok:admin'"


class TokenError(ValueError):
    """``RC_TOKENS`` is missing or malformed; the message is the start-up error line."""


def parse_tokens(value: str | None) -> dict[str, Role]:
    """Parse ``token:role`` entries, refusing anything ambiguous (SRV-005)."""
    if not value:
        raise TokenError(EXAMPLE)
    tokens: dict[str, Role] = {}
    for raw in value.split(","):
        entry = raw.strip()
        token, sep, role = entry.partition(":")
        if not sep:
            raise TokenError(f'malformed RC_TOKENS entry "{entry}"')
        if not token:
            raise TokenError(f'empty token in RC_TOKENS entry "{entry}"')
        if role not in {r.value for r in Role}:
            raise TokenError(f'unknown role "{role}" in RC_TOKENS')
        if token in tokens:
            raise TokenError(f'duplicate token "{token}" in RC_TOKENS')
        tokens[token] = Role(role)
    return tokens


class Authenticator:
    """Maps a presented bearer token to its role, comparing every known token in constant time."""

    def __init__(self, tokens: dict[str, Role]) -> None:
        self._tokens = [(t.encode(), r) for t, r in tokens.items()]

    def role_of(self, token: str) -> Role | None:
        presented = token.encode()
        found: Role | None = None
        for known, role in self._tokens:
            if hmac.compare_digest(known, presented):
                found = role
        return found

    @staticmethod
    def bearer(header: str | None) -> str:
        """The token of an ``Authorization: Bearer <token>`` header; '' when absent or malformed."""
        if header is None or not header.startswith("Bearer "):
            return ""
        return header[len("Bearer ") :]


def satisfies(role: Role, required: Role) -> bool:
    """Admin implies every role; worker and client are disjoint (AUTH-002)."""
    return role == Role.ADMIN or role == required
