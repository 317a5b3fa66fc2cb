"""An ASGI app of a test's stand-in (a judge, a scoring service, a hosted API) served by uvicorn
in a thread of the test process, on its own port."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class AppThread:
    def __init__(self, app: Any, port: int):
        # a call still sleeping in a slow answer would hold stop() for the rest of its sleep
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
