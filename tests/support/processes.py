"""What a child process of the tests needs: a free port, a clean environment, and a way to
kill or stop it."""

from __future__ import annotations

import itertools
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


# Each test process of a run (pytest-xdist's gw0, gw1, ...) takes its ports from a range of its
# own, below the kernel's ephemeral ports (32768 and up): a port the kernel handed one process
# (bind to 0) and that process released before its service bound it could go to another's.
# Lanes that run at the same time (tests/lanes.py) each have a block of such ranges.
PORTS_PER_PROCESS = 1000
PROCESSES_PER_BLOCK = 6
_ports = itertools.count()


def _first_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") else 0
    block = int(os.environ.get("CLAW_TEST_PORT_BLOCK", "0"))
    if index >= PROCESSES_PER_BLOCK or block > 2:
        raise RuntimeError(f"no port range for test process {worker} of block {block}")
    return 12000 + (block * PROCESSES_PER_BLOCK + index) * PORTS_PER_PROCESS


def free_port() -> int:
    """A loopback port no one listens on, from this test process's own range."""
    first = _first_port()
    for _ in range(PORTS_PER_PROCESS):
        port = first + next(_ports) % PORTS_PER_PROCESS
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + PORTS_PER_PROCESS}")


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
