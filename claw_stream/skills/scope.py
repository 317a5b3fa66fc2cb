"""Whose lesson a skill is. A user is their tenant when they have one, else the key their
sessions were started with (hashed, as Postgres keeps it), else `anonymous`: every call that
names neither, which on a laptop stack is its one user. `policy`: everyone."""

from __future__ import annotations

POLICY = "policy"
ANONYMOUS = "anonymous"


def user_scope(tenant: str | None, key_hash: str | None) -> str:
    if tenant:
        return f"tenant:{tenant}"
    if key_hash:
        return f"key:{key_hash}"
    return ANONYMOUS


def scopes_of(user: str) -> list[str]:
    """The scopes whose skills a user's calls carry: their own, then everyone's."""
    return [user, POLICY]
