"""The authorization matrix as data, and the one decision every gateway route asks of it.

Credentials (see `auth.Auth.caller` for how a request's key is told apart):

- admin key: every route, any session it names.
- client key (`gateway.client_key`; when none is set, any key that is not a session key, and no
  key at all, count as the client key): model calls and the session routes, on the session the
  call names by URL path, `X-Session-Id` or `session_id` in the body (OpenClaw-RL's and
  Claw-R1's conventions); it cannot start sessions or revoke keys.
- session key (from `/rl/start_session`): its own session only. Naming another session by
  path, header or body is a 403, whatever the route.
- none (no key, or a wrong one while a client key is set): 401.

docs/operations/security.md prints `MATRIX` as a table; `tests/unit/test_authz.py` plays `decide`
over all of it and `tests/component/test_authorization.py` every route against a real gateway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from claw_stream.dialect import OpenAIError

Credential = Literal["admin", "client", "session", "none"]
RouteKind = Literal["model_call", "session_route", "admin_route"]

# What each credential may do on each kind of route:
#   "any"   any session the call names (or none)
#   "named" the session the call names (or none: a model call then starts or joins one)
#   "own"   only the session its key belongs to; naming another is a 403
#   "no"    refused: 401
Rule = Literal["any", "named", "own", "no"]
MATRIX: dict[RouteKind, dict[Credential, Rule]] = {
    # POST /chat/completions, /completions, /responses, /messages and GET /models, under every
    # prefix of paths.PREFIXES
    "model_call": {"admin": "any", "client": "named", "session": "own", "none": "no"},
    # POST /rl/set_reward, /rl/feedback, /rl/end_session
    "session_route": {"admin": "any", "client": "named", "session": "own", "none": "no"},
    # POST /rl/start_session, /rl/revoke_key
    "admin_route": {"admin": "any", "client": "no", "session": "no", "none": "no"},
}


def decide(
    kind: RouteKind,
    credential: Credential,
    own: str | None,
    named: Mapping[str, str | None],
) -> str | None:
    """The session a request acts on, by `MATRIX`; raises the refusal otherwise.

    `own` is a session key's session; `named` maps where the request names a session (URL
    path, `X-Session-Id`, body `session_id`) to the name found there, or None/"" if nothing.
    Every place counts: a session key that names another session anywhere is refused, and a
    request that names two different sessions is a 400 whoever sends it.
    """
    rule = MATRIX[kind][credential]
    if rule == "no":
        if kind == "admin_route":
            raise OpenAIError(401, "admin key required (Authorization: Bearer <admin key>)")
        raise OpenAIError(401, "an API key is required")
    places = {where: name for where, name in named.items() if name}
    if rule == "own":
        assert own is not None, "a session key has a session"
        for where, name in places.items():
            if name != own:
                raise OpenAIError(
                    403,
                    f"a session key acts only on its own session ({own}); "
                    f"it cannot act on session {name} (named by {where})",
                    param="session_id",
                )
        return own
    if len(set(places.values())) > 1:
        which = ", ".join(f"{name} by {where}" for where, name in places.items())
        raise OpenAIError(400, f"the request names two sessions: {which}", param="session_id")
    return next(iter(places.values()), None)
