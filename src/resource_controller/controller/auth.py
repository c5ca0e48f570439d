"""Role tokens from ``RC_TOKENS``, compared in constant time, never logged."""

from __future__ import annotations

import hmac

from resource_controller.core.identity import NAME_MAX, Caller, valid_name
from resource_controller.core.states import Role

EXAMPLE = "RC_TOKENS required, e.g. RC_TOKENS='wtok:worker,ctok:client,atok:admin'"


class TokenError(ValueError):
    """``RC_TOKENS`` is missing or malformed; the message is the start-up error line."""


def parse_tokens(value: str | None) -> dict[str, Caller]:
    """``token:role[:name]`` entries, ambiguity refused; a name is ``[A-Za-z0-9._@/-]{1,64}``."""
    if not value:
        raise TokenError(EXAMPLE)
    tokens: dict[str, Caller] = {}
    for raw in value.split(","):
        entry = raw.strip()
        token, sep, rest = entry.partition(":")
        if not sep:
            raise TokenError(f'malformed RC_TOKENS entry "{entry}"')
        if not token:
            raise TokenError(f'empty token in RC_TOKENS entry "{entry}"')
        role, named, name = rest.partition(":")
        if role not in {r.value for r in Role}:
            raise TokenError(f'unknown role "{role}" in RC_TOKENS')
        if named and not valid_name(name):
            # The name, never the token: the message goes to stderr and into logs.
            raise TokenError(
                f'malformed name "{name}" for a {role} token in RC_TOKENS'
                f" (1-{NAME_MAX} characters of A-Z a-z 0-9 . _ @ / -)"
            )
        if token in tokens:
            raise TokenError(f'duplicate token "{token}" in RC_TOKENS')
        tokens[token] = Caller(Role(role), name if named else None)
    return tokens


class Authenticator:
    """Maps a presented bearer token to its caller, comparing every known token in constant time."""

    def __init__(self, tokens: dict[str, Caller]) -> None:
        self._tokens = [(t.encode(), c) for t, c in tokens.items()]

    def caller_of(self, token: str) -> Caller | None:
        presented = token.encode()
        found: Caller | None = None
        for known, caller in self._tokens:
            if hmac.compare_digest(known, presented):
                found = caller
        return found

    @staticmethod
    def bearer(header: str | None) -> str:
        """The token of an ``Authorization: Bearer <token>`` header; '' when absent or malformed."""
        if header is None or not header.startswith("Bearer "):
            return ""
        return header[len("Bearer ") :]


def satisfies(role: Role, required: Role) -> bool:
    """Admin implies every role; worker and client are disjoint."""
    return role == Role.ADMIN or role == required
