"""A commit the group refused (after a rebalance or a broker restart) must not crash the
worker's Faust consumer: Faust's own `_commit` decides, on aiokafka's real error."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

from aiokafka.errors import CommitFailedError
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

from claw_stream.worker.app import _commit_failures_as_rebalances

TP0 = TP("claw.steps", 0)


def faust_commit(commit: Any) -> tuple[bool, list[BaseException]]:
    crashes: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashes.append(exc)

    thread = SimpleNamespace(
        _ensure_consumer=lambda: SimpleNamespace(commit=commit),
        assignment=lambda: {TP0},
        tp_last_committed_at={},
        crash=crash,
        log=logging.getLogger("test"),
    )
    done = asyncio.run(faust_kafka.AIOKafkaConsumerThread._commit(thread, {TP0: 10}))  # type: ignore[arg-type]
    return done, crashes


async def refused(offsets: Any) -> None:
    raise CommitFailedError()  # what aiokafka raises for UnknownMemberId and the like


def test_faust_alone_crashes_its_consumer_on_a_refused_commit() -> None:
    """Why the wrapper exists (faust-streaming 0.15.3 with aiokafka 0.14): when this fails,
    Faust recognises aiokafka's error itself and the wrapper can go."""
    done, crashes = faust_commit(refused)
    assert not done
    assert [type(c) for c in crashes] == [CommitFailedError]


def test_a_refused_commit_is_a_rebalance_for_the_worker() -> None:
    assert faust_commit(_commit_failures_as_rebalances(refused)) == (False, [])
