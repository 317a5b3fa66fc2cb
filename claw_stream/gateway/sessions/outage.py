"""Postgres away: what the gateway knows of it, and the error of a call that needs it.

A call of a session the gateway knows (named by header or path, or by a session key it has
looked up before) does not need Postgres: it is served and its Step published, and what it
would have written (the session's turn counter and last-seen time, main-line heads, the end of
a session) waits in a journal (`SessionStore.journal`, `MainLines.unstored`) that is written
when Postgres is back. Only what truly needs the database is refused while it is away, with 503
and Retry-After in the client's own error shape: a session key never seen, `/rl/start_session`,
forget, the switches.
"""

from __future__ import annotations

import logging
import time

from claw_stream.dialect import OpenAIError
from claw_stream.store.db import is_database_down

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5  # an embedded Postgres restarts in ~20 s, a managed one fails over in 10-60 s
DOWN_CODE = "database_unavailable"


class Outage:
    """Whether Postgres is reachable, as this process last found it."""

    def __init__(self) -> None:
        self.down_since: float | None = None  # monotonic
        self.last_error = ""
        self.outages = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def seconds(self) -> float:
        return 0.0 if self.down_since is None else time.monotonic() - self.down_since

    def mark_down(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.outages += 1
            log.warning(
                "Postgres is unreachable (%s): known sessions are served, their bookkeeping"
                " waits in the journal",
                self.last_error,
            )

    def caught(self, exc: BaseException) -> bool:
        """Whether `exc` says Postgres is away (`store.db.is_database_down`); if so, noted."""
        if not is_database_down(exc):
            return False
        self.mark_down(exc)
        return True

    def mark_up(self) -> None:
        if self.down_since is not None:
            log.warning("Postgres is back after %.1f s", self.seconds())
            self.down_since = None


class OneLine(logging.Filter):
    """asyncpg's pool logs the failed reconnects of an outage with their traceback ("Failed to
    restore the pool connection floor"): a line each is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            if is_database_down(exc):
                record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
                record.args = None
                record.exc_info = None
        return True


def quiet_reconnects() -> None:
    logging.getLogger("asyncpg.pool").addFilter(OneLine())


def unavailable(needs: str) -> OpenAIError:
    """The error of a request that cannot be served without Postgres."""
    return OpenAIError(
        503,
        f"the session database is unavailable (restarting?); {needs} needs it."
        f" Retry in {RETRY_AFTER_S} s.",
        headers={"Retry-After": str(RETRY_AFTER_S)},
        code=DOWN_CODE,
    )
