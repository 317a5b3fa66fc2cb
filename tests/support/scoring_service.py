"""A user's scoring service for the `external` reward source, on a free port."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request

from .app_thread import AppThread
from .processes import free_port


class Callback:
    """The user's scoring service: 0.25 for every answer (its length as the explanation); an
    answer that says SLOW waits 3 s for its score."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/score"
        app = FastAPI()

        @app.post("/score")
        async def score(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.bodies.append(body)
            text = body["turn"]["step"]["response"]["message"]["content"]
            if "SLOW" in text:
                await asyncio.sleep(3)
            return {"score": 0.25, "explanation": f"{len(text)} characters"}

        self.served = AppThread(app, self.port)

    def stop(self) -> None:
        self.served.stop()
