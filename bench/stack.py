"""The embedded stack a bench runs on: `claw-stream up` on a fresh data dir and free ports,
stopped with Ctrl-C's signal when the bench ends (its logs stay in the data dir)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.processes import free_port  # noqa: E402

ADMIN = "bench-admin-key"
READY = "Ctrl-C stops everything"  # what `claw-stream up` prints once every service is up


@dataclass
class Stack:
    data: Path
    ports: dict[str, int]
    env: dict[str, str]  # add settings before `running` starts it
    admin: str = ADMIN

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.ports['gateway']}"

    @property
    def engine(self) -> str:
        return f"http://127.0.0.1:{self.ports['engine']}"

    @property
    def dsn(self) -> str:
        """Its Postgres for asyncpg."""
        return f"postgresql://claw@127.0.0.1:{self.ports['pg']}/claw"


def new_stack(prefix: str, port: Callable[[], int] = free_port) -> Stack:
    """A stack's data dir, ports (each from `port`) and environment (not started)."""
    data = Path(tempfile.mkdtemp(prefix=prefix))
    ports = {name: port() for name in ("broker", "pg", "engine", "gateway", "trainer", "w")}
    env = {
        **os.environ,
        "CLAW_DATA_DIR": str(data),
        "CLAW_ADMIN_KEY": ADMIN,
        "CLAW_BROKER_PORT": str(ports["broker"]),
        "CLAW_POSTGRES_PORT": str(ports["pg"]),
        "CLAW_DATABASE_URL": f"postgresql+asyncpg://claw@127.0.0.1:{ports['pg']}/claw",
        "CLAW_ENGINE__PORT": str(ports["engine"]),
        "CLAW_GATEWAY__PORT": str(ports["gateway"]),
        "CLAW_TRAINER__METRICS_PORT": str(ports["trainer"]),
        "CLAW_WORKER__METRICS_PORT": str(ports["w"]),
        "COLUMNS": "200",  # `up` prints through rich: a narrow log would wrap the READY line
    }
    env.setdefault("CLAW_MODELS_DIR", str(REPO / ".cache" / "tests" / "models"))
    return Stack(data, ports, env)


@contextmanager
def running(stack: Stack, *up_args: str, console: Console) -> Iterator[Stack]:
    """`claw-stream up *up_args` until the block ends; it exits with the log's tail if the
    stack is not up within 10 minutes."""
    out = stack.data / "up.out"
    with out.open("w") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "claw_stream", "up", *up_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=stack.env,
        )
    try:
        started = time.monotonic()
        while READY not in out.read_text():
            if up.poll() is not None or time.monotonic() - started > 600:
                raise SystemExit(out.read_text()[-3000:])
            time.sleep(1)
        console.print(
            f"stack ready in {time.monotonic() - started:.0f}s (logs: {stack.data / 'logs'})"
        )
        yield stack
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=120)
