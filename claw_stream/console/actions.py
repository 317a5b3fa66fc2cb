"""The console's buttons: each is an existing route of the session API, called with the admin
key (the same authorization as any client), or the CLI's own code (`claw-stream rollback`).
The console adds no second way to change state."""

from __future__ import annotations

from typing import Any

import httpx

from claw_stream.dialect import openai_error_message
from claw_stream.settings import Settings
from claw_stream.versions import ServingError
from claw_stream.versions.rollback import rollback


class ActionError(RuntimeError):
    """The route refused: its status and message, shown on the page."""


async def _post(http: httpx.AsyncClient, gateway: str, key: str, path: str, body: Any) -> Any:
    try:
        r = await http.post(
            f"{gateway.rstrip('/')}{path}", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    except httpx.HTTPError as exc:
        raise ActionError(f"the gateway at {gateway} did not answer: {exc}") from None
    if r.status_code >= 400:
        try:
            message, _ = openai_error_message(r.json())
        except ValueError:
            message = r.text[:300]
        raise ActionError(f"{path}: {r.status_code} {message}")
    return r.json()


async def switch_training(
    http: httpx.AsyncClient, gateway: str, key: str, session_id: str, enabled: bool
) -> str:
    await _post(http, gateway, key, f"/rl/sessions/{session_id}/train", {"enabled": enabled})
    if enabled:
        return f"{session_id} trains again"
    return f"{session_id} switched off: its samples not yet trained are withdrawn"


async def forget(http: httpx.AsyncClient, gateway: str, key: str, session_id: str) -> str:
    done = await _post(http, gateway, key, "/rl/forget", {"session_id": session_id})
    removed = sum(done.get("removed", {}).values())
    return f"{session_id} forgotten: {removed} rows deleted"


async def label(
    http: httpx.AsyncClient,
    gateway: str,
    key: str,
    session_id: str,
    step_id: str,
    score: int,
    note: str = "",
) -> str:
    """Thumbs on a turn, and the admin's note on it as feedback text: evidence for the judge
    and, where it asks for something, a skill of the session's user."""
    body: dict[str, object] = {"session_id": session_id, "step_id": step_id, "score": score}
    if note.strip():
        body["text"] = note.strip()
    await _post(http, gateway, key, "/rl/feedback", body)
    said = f"turn labelled {'good' if score > 0 else 'bad'}: it trains as feedback"
    return said + (", its note as feedback text" if note.strip() else "")


async def serve(settings: Settings, version: int, reason: str) -> str:
    try:
        done = await rollback(settings, version, reason)
    except ServingError as exc:
        raise ActionError(str(exc)) from None
    return f"serving v{done.version} (was v{done.previous}) on {', '.join(done.engines)}"
