"""A user's scoring service for the `external` reward source, on a free port."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request

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

        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
