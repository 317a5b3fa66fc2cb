"""Postgres away: which errors say so, and how a request that needs it is refused."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError
from tenacity import wait_none

from claw_stream.gateway.doors import DOORS
from claw_stream.gateway.sessions.outage import RETRY_AFTER_S, Outage, unavailable
from claw_stream.store.db import is_database_down, until_database_back


def _wrapped(inner: BaseException) -> DBAPIError:
    """As SQLAlchemy's asyncpg dialect raises it: the driver's error as the cause."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise RuntimeError("adapted") from exc
    except RuntimeError as adapted:
        return DBAPIError("SELECT 1", None, adapted)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.AdminShutdownError("terminating connection"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.InterfaceError("connection is closed"),
    ],
)
def test_what_postgres_away_looks_like(exc: BaseException) -> None:
    assert is_database_down(exc)
    assert is_database_down(_wrapped(exc))


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad"),
        asyncpg.UniqueViolationError("duplicate key"),
        IntegrityError("INSERT", None, ValueError("duplicate")),
        DBAPIError("SELECT", None, None),  # type: ignore[arg-type]
    ],
)
def test_a_faulty_statement_is_not_an_outage(exc: BaseException) -> None:
    assert not is_database_down(exc)


def test_the_refusal_says_when_to_retry_in_each_doors_shape() -> None:
    refused = unavailable("a session key this gateway has not seen before")
    assert refused.status == 503
    assert refused.headers == {"Retry-After": str(RETRY_AFTER_S)}
    for door in DOORS:
        body = door.error_shape(refused)
        # Google's shape names the kind `status`, the others `type`
        assert body["error"]["status" if door.tag == "gemini" else "type"], door.api
        assert "session database is unavailable" in body["error"]["message"], door.api
        if door.tag == "anthropic":
            assert body["type"] == "error"
        if door.tag == "gemini":
            assert body["error"]["status"] == "UNAVAILABLE" and body["error"]["code"] == 503


def test_outage_counts_each_outage_once() -> None:
    outage = Outage()
    assert not outage.down and outage.seconds() == 0.0
    outage.mark_down(ConnectionRefusedError())
    outage.mark_down(asyncpg.CannotConnectNowError("starting up"))
    assert outage.down and outage.outages == 1
    assert "CannotConnectNowError" in outage.last_error
    outage.mark_up()
    assert not outage.down
    outage.mark_down(OSError("reset"))
    assert outage.outages == 2


async def test_retries_wait_out_an_outage_and_give_up_on_anything_else() -> None:
    failures = [ConnectionRefusedError(), asyncpg.CannotConnectNowError("starting up")] * 3
    calls = 0
    async for attempt in until_database_back(0).copy(wait=wait_none()):
        with attempt:
            calls += 1
            if failures:
                raise failures.pop()
    assert calls == 7  # six outage errors waited out, then done

    calls = 0
    with pytest.raises(ValueError):
        async for attempt in until_database_back(0).copy(wait=wait_none()):
            with attempt:
                calls += 1
                raise ValueError("a faulty statement")
    assert calls == 1
