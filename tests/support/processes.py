"""What a child process of the tests needs: a free port and a clean environment."""

from __future__ import annotations

import os
import socket

# set in the test process by the in-process trainer tests; a child process must pick its own
DIST_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR"}


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process of the tests."""
    return {k: v for k, v in {**os.environ, **extra}.items() if k not in DIST_VARS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
