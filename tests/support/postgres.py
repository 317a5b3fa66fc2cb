"""Databases of their own on the session's embedded PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from claw_stream.embedded.postgres import EmbeddedPostgres
from claw_stream.store import migrate


def database_url(postgres: EmbeddedPostgres, name: str) -> str:
    return f"postgresql+asyncpg://{postgres.user}@{postgres.host}:{postgres.port}/{name}"


async def create_database(postgres: EmbeddedPostgres, prefix: str) -> str:
    """A new, empty database; its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(postgres.dsn("postgres"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return name


async def drop_database(postgres: EmbeddedPostgres, name: str) -> None:
    conn = await asyncpg.connect(postgres.dsn("postgres"))
    try:
        await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def new_database(postgres: EmbeddedPostgres, prefix: str) -> str:
    """A new, migrated database on the session's Postgres; its SQLAlchemy URL."""
    url = database_url(postgres, asyncio.run(create_database(postgres, prefix)))
    asyncio.run(migrate.upgrade(url))
    return url
