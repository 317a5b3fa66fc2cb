"""A part's one long-running loop: started with the part, cancelled and awaited at its stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class Background:
    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    def start(self, loop: Coroutine[Any, Any, None]) -> None:
        self.task = asyncio.create_task(loop)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
