"""Async engine and session factory; a Postgres outage told apart from a faulty statement, and
retries that wait one out."""

from __future__ import annotations

import logging
from collections.abc import Callable

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from tenacity import AsyncRetrying, RetryCallState, stop_after_delay, wait_exponential
from tenacity.stop import stop_base

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


def stop_unless_away(
    away: Callable[[BaseException], bool], then: stop_base
) -> Callable[[RetryCallState], bool]:
    """A tenacity stop that never stops while the last error says a service is away (`away`:
    a restart, a failover; the caller pauses and goes on where it was), else as `then`."""

    def stop(state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome is not None else None
        return not (exc is not None and away(exc)) and then(state)

    return stop


def log_pauses(what: str, logger: logging.Logger = log) -> Callable[[RetryCallState], None]:
    """A tenacity `before_sleep` that says a retry loop is paused, a line now and then."""

    def paused(state: RetryCallState) -> None:
        if state.attempt_number in (1, 10) or state.attempt_number % 60 == 0:
            exc = state.outcome.exception() if state.outcome is not None else None
            logger.warning("%s (attempt %d): %r", what, state.attempt_number, exc)

    return paused


def until_database_back(other_errors_s: float = 60.0, what: str = "waits") -> AsyncRetrying:
    """Retries of a statement: as long as Postgres is unreachable, `other_errors_s` on any
    other error."""
    return AsyncRetrying(
        stop=stop_unless_away(is_database_down, stop_after_delay(other_errors_s)),
        wait=wait_exponential(max=5),
        before_sleep=log_pauses(f"{what} for Postgres"),
        reraise=True,
    )
