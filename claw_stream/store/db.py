"""Async engine and session factory."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine


def asyncpg_dsn(database_url: str) -> str:
    """The settings' SQLAlchemy URL as a DSN that asyncpg connects to itself."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


def make_engine(database_url: str, **kwargs: object) -> AsyncEngine:
    return create_async_engine(database_url, pool_pre_ping=True, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)
