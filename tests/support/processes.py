"""What a child process of the tests needs: a free port, a clean environment, and a way to
kill or stop it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

# set in the test process by the in-process trainer tests; a child process must pick its own
DIST_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR"}


# the tests count turns and samples: none is held out for the replay (default 0.1) unless a test
# asks for it
TEST_DEFAULTS = {"CLAW_EVAL__HOLDOUT_SHARE": "0"}


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process of the tests."""
    merged = {**TEST_DEFAULTS, **os.environ, **extra}
    return {k: v for k, v in merged.items() if k not in DIST_VARS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChildService:
    """A service the tests run as a child process: `kill` is the SIGKILL of a crash, `stop` a
    clean end that waits `stop_timeout_s`."""

    proc: subprocess.Popen[bytes] | None = None
    stop_timeout_s = 20.0

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=self.stop_timeout_s)
