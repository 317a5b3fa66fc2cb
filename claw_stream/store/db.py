"""Async engine and session factory."""

from __future__ import annotations

import logging

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from tenacity import AsyncRetrying, RetryCallState, wait_exponential

log = logging.getLogger(__name__)


def asyncpg_dsn(database_url: str) -> str:
    """The settings' SQLAlchemy URL as a DSN that asyncpg connects to itself."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


def make_engine(database_url: str, **kwargs: object) -> AsyncEngine:
    return create_async_engine(database_url, pool_pre_ping=True, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)


# What a client meets while Postgres is away (refused, starting up, shutting down, a connection
# cut mid-statement, a timeout), as told apart from a fault of the statement itself.
DATABASE_DOWN: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, TimeoutError
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # starting up, shutting down, crashed
    asyncpg.InterfaceError,  # the connection was closed under a statement
)


def is_database_down(exc: BaseException) -> bool:
    """Whether `exc` says Postgres is unreachable (asyncpg's own, or wrapped by SQLAlchemy)."""
    if isinstance(exc, DBAPIError):
        inner = exc.orig or exc.__cause__
        return exc.connection_invalidated or (inner is not None and is_database_down(inner))
    if isinstance(exc, DATABASE_DOWN):
        return True
    cause = exc.__cause__
    return cause is not None and cause is not exc and isinstance(cause, DATABASE_DOWN)


def until_database_back(other_errors_s: float = 60.0, what: str = "waits") -> AsyncRetrying:
    """Retries of a statement: as long as Postgres is unreachable (a restart, a failover: the
    caller pauses and goes on where it was), `other_errors_s` on any other error."""

    def gives_up(state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome is not None else None
        away = exc is not None and is_database_down(exc)
        return not away and (state.seconds_since_start or 0.0) >= other_errors_s

    def paused(state: RetryCallState) -> None:
        if state.attempt_number in (1, 10) or state.attempt_number % 60 == 0:
            exc = state.outcome.exception() if state.outcome is not None else None
            log.warning("%s for Postgres (attempt %d): %r", what, state.attempt_number, exc)

    return AsyncRetrying(
        stop=gives_up, wait=wait_exponential(max=5), before_sleep=paused, reraise=True
    )
