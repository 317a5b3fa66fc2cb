"""Which front door a path names, and the session and group it carries.

Clients configure a base URL and append the API's own path to it; the known ones use the root
(AReaL, ZeroClaw), `/v1` (OpenAI SDK defaults, OpenClaw), `/{session}/{group}` (Claw-R1),
`/{session}/{group}/v1` and `/{session}/v1`. Every API answers under each of them.

Gemini's paths carry their own API version and the model (`/v1beta/models/{model}:generateContent`,
appended by its SDK to `GOOGLE_GEMINI_BASE_URL`): they answer under the root, `/{session}` and
`/{session}/{group}` (`GEMINI_PREFIXES`), the version standing where `/v1` stands for the others.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from claw_stream.gateway.doors import DOORS
from claw_stream.gateway.gemini.protocol import GEMINI_PATH

# the base URLs each API answers under, as FastAPI path templates (for the OpenAPI document)
PREFIXES = (
    "",
    "/v1",
    "/{session_id}/v1",
    "/{session_id}/{group_id}",
    "/{session_id}/{group_id}/v1",
)
# the base URLs of Gemini's paths, which carry their own version (`Door.own_version`)
GEMINI_PREFIXES = ("", "/{session_id}", "/{session_id}/{group_id}")
MODELS = "/models"  # GET, FastAPI's; every other endpoint is a door's
_VERSIONED = {door.api: door.endpoint for door in DOORS if not door.own_version}
ENDPOINTS: dict[str, str] = _VERSIONED | {"models": MODELS}
# Gemini's methods (`:generateContent`, ...) and the door of each
GEMINI_METHODS = {door.endpoint.rsplit(":", 1)[1]: door.api for door in DOORS if door.own_version}

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
    gemini = GEMINI_PATH.fullmatch(path)
    if gemini is not None:
        return _gemini_route(gemini)
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


def _gemini_route(match: re.Match[str]) -> Route | None:
    """`{base}/v1beta/models/{model}:{method}`: the base names the session and group as the
    others' do, the version standing for their `/v1`."""
    api = GEMINI_METHODS.get(match["method"])
    if api is None:
        return None
    base = match["base"][1:].split("/") if match["base"] else []
    if base and base[-1] == "v1":  # a base URL ending in /v1, given out of habit
        base = base[:-1]
    if not base:
        return Route(api, None, None)
    if len(base) <= 2 and all(base):
        return Route(api, base[0], base[1] if len(base) == 2 else None)
    return None
