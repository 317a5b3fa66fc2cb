"""What every front door shares of the gateway's wire format: the session fields a client may put
in its body, and the note a translating door leaves on the Step. Each door's own request
models are in its folder (`chat/protocol.py`, `responses/protocol.py`, ...)."""

from __future__ import annotations

SESSION_FIELDS = ("session_id", "turn_type", "session_done", "train")  # the body extension

# What the Responses, Messages and Gemini doors note of a call beyond its chat body (tools left out,
# fields not honoured): the Step keeps it in `request.extra`, the engine never sees it.
DOOR_FIELD = "claw_door"
