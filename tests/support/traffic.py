"""Agents calling a gateway, for as long as a test's scenario needs them to.

A scenario moves on when enough calls were answered, not after so many seconds: on a loaded
machine a fixed window saw a handful of calls where the test asked for 10 or 30 (a gateway
killed 1.5 s into a 4 s window answered 4 calls, a broker-loss scenario 18 of 30)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict

import httpx

from .gateway import OTHER


class Traffic:
    """Each session calls in turn, as an agent does, alternating whole and streamed answers,
    from `start()` until `stop()`. `answered[session]` lists the Step ids of its answered
    calls in call order; a call that failed (refused, cut, no answer) is counted in
    `failures`."""

    def __init__(
        self,
        base_url: str,
        sessions: list[str],
        answered: dict[str, list[str]] | None = None,
        timeout_s: float = 30.0,
    ):
        self.base_url = base_url
        self.sessions = sessions
        self.answered: dict[str, list[str]] = (
            answered if answered is not None else defaultdict(list)
        )
        self.timeout_s = timeout_s
        self.failures = 0
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._progress = asyncio.Event()

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.answered.values())

    def start(self) -> Traffic:
        self._tasks = [asyncio.create_task(self._calls(s)) for s in self.sessions]
        return self

    async def stop(self) -> int:
        """Let every call in flight end, then stop; how many calls failed."""
        self._stopping.set()
        await asyncio.gather(*self._tasks)
        return self.failures

    async def until(self, n: int, what: str, timeout_s: float = 180.0) -> int:
        """Wait until `n` calls in all were answered; the count."""
        deadline = time.monotonic() + timeout_s
        while self.count < n:
            for task in self._tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.count} of {n} calls answered after {timeout_s:.0f} s ({what});"
                    f" {self.failures} failed"
                )
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), min(left, 1.0))
        return self.count

    async def more(self, n: int, what: str, timeout_s: float = 180.0) -> int:
        """Wait until `n` more calls than now were answered."""
        return await self.until(self.count + n, what, timeout_s)

    async def _calls(self, session: str) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s) as c:
            while not self._stopping.is_set():
                try:
                    r = await c.post(
                        "/v1/chat/completions",
                        json={
                            "model": "policy",
                            "messages": OTHER,
                            "max_tokens": 4,
                            "stream": len(self.answered[session]) % 2 == 1,
                        },
                        headers={"X-Session-Id": session},
                    )
                    await r.aread()
                except httpx.HTTPError:
                    self.failures += 1
                    await asyncio.sleep(0.2)  # a gateway restarting: not a busy loop
                    continue
                if r.status_code != 200 or (
                    b"[DONE]" not in r.content
                    and r.headers.get("content-type", "").startswith("text/event-stream")
                ):
                    self.failures += 1
                    continue
                self.answered[session].append(r.headers["x-claw-step-id"])
                self._progress.set()


async def calls(
    base_url: str, sessions: list[str], n: int, answered: dict[str, list[str]], what: str
) -> int:
    """`n` more calls answered across `sessions`; how many failed meanwhile."""
    traffic = Traffic(base_url, sessions, answered).start()
    try:
        await traffic.more(n, what)
    finally:
        failures = await traffic.stop()
    return failures
