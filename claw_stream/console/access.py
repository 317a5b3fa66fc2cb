"""Who is asking: the console is the admin's. The admin key (a cookie set at login, or a
bearer header) opens it; a session's own key is known and refused (403); anything else is
asked to log in (401)."""

from __future__ import annotations

import hmac
from typing import Literal

from fastapi import Request
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from claw_stream.store import models as m
from claw_stream.store.consent import hash_key

COOKIE = "claw_console"
Caller = Literal["admin", "session", "none"]


def presented(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.cookies.get(COOKIE) or None


async def caller(key: str | None, admin_key: str, db: AsyncEngine) -> Caller:
    if key is None:
        return "none"
    if hmac.compare_digest(key.encode(), admin_key.encode()):
        return "admin"
    h = hash_key(key)
    async with db.connect() as conn:
        found = await conn.scalar(
            select(m.Session.session_id)
            .where((m.Session.key_hash == h) | (m.Session.owner_key_hash == h))
            .limit(1)
        )
    return "session" if found is not None else "none"
