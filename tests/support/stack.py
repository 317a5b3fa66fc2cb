"""`claw-stream up` as a child process: its ports, its output, its services' pids."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg

from .paths import CACHE
from .processes import child_env, free_port
from .service_logs import watch, watch_folder


class Up:
    """`claw-stream up` on free ports, with the test cache's models; ready once it prints so."""

    def __init__(self, data_dir: Path, *flags: str, **env_extra: str):
        self.data_dir = data_dir
        self.broker_port, self.pg_port = free_port(), free_port()
        self.engine_port, self.gateway_port, self.trainer_port, self.worker_port = (
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        )
        self.env = env = child_env(
            CLAW_DATA_DIR=str(data_dir),
            CLAW_BROKER_PORT=str(self.broker_port),
            CLAW_POSTGRES_PORT=str(self.pg_port),
            CLAW_ENGINE__PORT=str(self.engine_port),
            CLAW_GATEWAY__PORT=str(self.gateway_port),
            CLAW_TRAINER__METRICS_PORT=str(self.trainer_port),
            CLAW_WORKER__METRICS_PORT=str(self.worker_port),
            CLAW_MODELS_DIR=str(CACHE / "models"),
            COLUMNS="200",
            **env_extra,
        )
        watch_folder("up", data_dir / "logs")
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.output = watch("up", data_dir.parent / f"{data_dir.name}-up.log").open("a")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "claw_stream", "up", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.output.write(line)
            self.output.flush()
            if "Ctrl-C stops everything" in line:
                self.ready.set()

    def wait_ready(self, timeout: float = 60) -> float:
        assert self.ready.wait(timeout), "".join(self.lines)
        return time.monotonic() - self.started

    def infra_ready_s(self) -> str:
        line = next(line for line in self.lines if "topics and migrations ready in" in line)
        return line.rsplit(" ", 1)[1].rstrip("s\n")

    def service_pids(self) -> dict[str, int]:
        info = json.loads((self.data_dir / "run" / "up.json").read_text())
        return {name: s["pid"] for name, s in info["services"].items()}

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`claw-stream ARGS` against this stack, as a user runs it beside `up`: its settings
        (the env `up` got, its Postgres, its engine as the judge), `env` on top."""
        return subprocess.run(
            [sys.executable, "-m", "claw_stream", *args],
            env={
                **self.env,
                "CLAW_DATABASE_URL": f"postgresql+asyncpg://claw@127.0.0.1:{self.pg_port}/claw",
                "CLAW_WORKER__JUDGE_URL": f"http://127.0.0.1:{self.engine_port}/v1",
                "COLUMNS": "220",
                **env,
            },
            capture_output=True,
            text=True,
            timeout=600,
        )

    def rows(self, query: str, *args: Any) -> list[asyncpg.Record]:
        """The rows of `query` in this stack's Postgres."""

        async def fetch() -> list[asyncpg.Record]:
            conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{self.pg_port}/claw")
            try:
                return list(await conn.fetch(query, *args))
            finally:
                await conn.close()

        return asyncio.run(fetch())

    def logs(self, tail: int = 3000) -> str:
        """`up`'s own output and the end of every service's log: what a failing test shows."""
        services = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
            for p in sorted((self.data_dir / "logs").glob("*"))
        )
        return "".join(self.lines)[-tail:] + "\n" + services

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)
