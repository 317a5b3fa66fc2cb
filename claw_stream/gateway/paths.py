"""Which front door a path names, and the session and group it carries.

Clients configure a base URL and append the API's own path to it; the known ones use the root
(AReaL, ZeroClaw), `/v1` (OpenAI SDK defaults, OpenClaw), `/{session}/{group}` (Claw-R1),
`/{session}/{group}/v1` and `/{session}/v1`. Every API answers under each of them.
"""

from __future__ import annotations

from typing import NamedTuple

from claw_stream.gateway.doors import DOORS

# the base URLs each API answers under, as FastAPI path templates (for the OpenAPI document)
PREFIXES = (
    "",
    "/v1",
    "/{session_id}/v1",
    "/{session_id}/{group_id}",
    "/{session_id}/{group_id}/v1",
)
MODELS = "/models"  # GET, FastAPI's; every other endpoint is a door's
ENDPOINTS: dict[str, str] = {door.api: door.endpoint for door in DOORS} | {"models": MODELS}
# each endpoint's path segments, the longest first: `/messages/count_tokens` before `/messages`
_SEGMENTS = sorted(
    ((api, endpoint.strip("/").split("/")) for api, endpoint in ENDPOINTS.items()),
    key=lambda item: -len(item[1]),
)


class Route(NamedTuple):
    api: str
    session_id: str | None
    group_id: str | None


def route(path: str) -> Route | None:
    """The front door `path` names; None for any other path.

    `/a/b/chat/completions` is chat for session a, group b; `/a/chat/completions` is no route
    (a session without a group needs the `/v1`), so a group named `chat` never turns a chat
    call into a legacy completions call. A doubled `/v1/v1` counts once: no session is named
    `v1`.
    """
    parts = path.strip("/").split("/")
    found = next(((a, s) for a, s in _SEGMENTS if parts[-len(s) :] == s), None)
    if found is None:
        return None
    api, segments = found
    base = parts[: -len(segments)]
    versioned = bool(base) and base[-1] == "v1"
    if versioned:
        base = base[:-1]
        if base and base[-1] == "v1":
            # a base URL ending in /v1 given to a client that appends /v1 itself (Anthropic's)
            base = base[:-1]
    if not base:
        return Route(api, None, None)
    if len(base) == 1 and versioned:
        return Route(api, base[0], None)
    if len(base) == 2 and all(base):
        return Route(api, base[0], base[1])
    return None
