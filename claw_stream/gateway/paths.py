"""Which front door a path names, and the session and group it carries.

Clients configure a base URL and append the API's own path to it; the known ones use the root
(AReaL, ZeroClaw), `/v1` (OpenAI SDK defaults, OpenClaw), `/{session}/{group}` (Claw-R1),
`/{session}/{group}/v1` and `/{session}/v1`. Every API answers under each of them.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Api = Literal["chat", "completions", "responses", "messages", "count_tokens", "models"]
APIS: dict[str, Api] = {
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
    "models": "models",
}
# the base URLs each API answers under, as FastAPI path templates (for the OpenAPI document)
PREFIXES = (
    "",
    "/v1",
    "/{session_id}/v1",
    "/{session_id}/{group_id}",
    "/{session_id}/{group_id}/v1",
)
ENDPOINTS: dict[Api, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "responses": "/responses",
    "messages": "/messages",
    "count_tokens": "/messages/count_tokens",
    "models": "/models",
}


class Route(NamedTuple):
    api: Api
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
    if parts[-2:] == ["chat", "completions"]:
        api: Api = "chat"
        base = parts[:-2]
    elif parts[-2:] == ["messages", "count_tokens"]:
        api, base = "count_tokens", parts[:-2]
    elif parts[-1] in APIS:
        api = APIS[parts[-1]]
        base = parts[:-1]
    else:
        return None
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
