"""`GET /rl/skills`: the skills a user's calls carry, for the admin (the demo waits on it, a
dashboard reads it). Steering them is `claw-stream skills` and the console's skills page."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.service import Gateway
from claw_stream.skills.scope import ANONYMOUS, POLICY, user_scope
from claw_stream.store.consent import hash_key

router = APIRouter(prefix="/rl", tags=["skills"])


class SkillOut(BaseModel):
    skill_id: str
    scope: str
    text: str
    state: str
    source: str
    confirmations: int
    provenance: list[dict[str, Any]]
    created_at: datetime
    updated_at: datetime


class SkillsAnswer(BaseModel):
    enabled: bool  # skills.enabled of this gateway: whether calls carry skills at all
    skills: list[SkillOut]


@router.get("/skills", response_model=SkillsAnswer)
async def list_skills(
    request: Request,
    tenant: str | None = None,
    api_key: str | None = None,
    everyone: bool = False,
    anonymous: bool = False,
    retired: bool = False,
) -> SkillsAnswer:
    """A user's skills (`tenant`, `api_key`, `anonymous`) or everyone's (`everyone`); none of
    them named: all. Active and pinned ones, most confirmed first; `retired` adds those. The
    admin key only."""
    gateway: Gateway = request.app.state.gateway
    await gateway.auth.authorize(request.headers, "admin_route", {})
    named = [
        scope
        for scope, given in (
            (user_scope(tenant, None) if tenant else None, tenant),
            (user_scope(None, hash_key(api_key)) if api_key else None, api_key),
            (POLICY, everyone or None),
            (ANONYMOUS, anonymous or None),
        )
        if given
    ]
    if len(named) > 1:
        raise OpenAIError(422, "name at most one of tenant, api_key, everyone, anonymous")
    states = ["active", "pinned", "retired"] if retired else ["active", "pinned"]
    pool = gateway.sessions.pool
    if pool is None:
        raise OpenAIError(503, "the gateway is starting")
    rows = await pool.fetch(
        "SELECT skill_id, scope, text, state, source, confirmations, provenance, created_at,"
        " updated_at FROM skills WHERE state = ANY($1) AND ($2::text IS NULL OR scope = $2)"
        " ORDER BY scope, confirmations DESC, updated_at DESC LIMIT 1000",
        states,
        named[0] if named else None,
    )
    return SkillsAnswer(
        enabled=gateway.settings.skills.enabled,
        skills=[
            SkillOut(
                skill_id=str(row["skill_id"]),
                scope=row["scope"],
                text=row["text"],
                state=row["state"],
                source=row["source"],
                confirmations=row["confirmations"],
                provenance=_json(row["provenance"]),
                created_at=row["created_at"],
                updated_at=row["updated_at"],
            )
            for row in rows
        ],
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
