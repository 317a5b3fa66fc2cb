"""A real gateway process, and reading what it wrote to the broker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from aiokafka import ConsumerRecord

from claw_stream.events import DeadLetter, SessionEvent, Step, decode_event

from . import topic_reads
from .engine import ADMIN_KEY, EngineProcess
from .processes import ChildService, free_port
from .service_logs import watch

# a prompt any tiny model answers
OTHER = [{"role": "user", "content": "Tell me something."}]


class GatewayProcess(ChildService):
    def __init__(
        self,
        bootstrap: str,
        database_url: str,
        backends: list[str],
        data_dir: Path,
        port: int | None = None,
        workers: int = 1,
        env: dict[str, str] | None = None,
    ):
        self.port = port or free_port()
        self.bootstrap = bootstrap
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "claw_stream",
            "gateway",
            "--port",
            str(self.port),
            "--backends",
            ",".join(backends),
            "--workers",
            str(workers),
        ]
        self.env = {
            **os.environ,
            "CLAW_KAFKA_BOOTSTRAP": bootstrap,
            "CLAW_DATABASE_URL": database_url,
            "CLAW_ADMIN_KEY": ADMIN_KEY,
            "CLAW_DATA_DIR": str(data_dir),
            "CLAW_GATEWAY__PUBLISH_TIMEOUT_S": "1.0",
            **(env or {}),
        }
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        log = watch("gateway", self.data_dir / f"gateway-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.data_dir / f"gateway-{self.port}.log").read_text()[-3000:])
            try:
                if httpx.get(self.base_url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("gateway did not start")

    def log(self) -> str:
        """What the gateway wrote (to show with a failing test)."""
        return (self.data_dir / f"gateway-{self.port}.log").read_text(errors="replace")


def _of_sessions(
    records: list[ConsumerRecord], session_ids: set[str] | None
) -> list[ConsumerRecord]:
    """Records keyed by the sessions asked for (other tests share the topic), in topic order."""
    keys = None if session_ids is None else {s.encode() for s in session_ids}
    chosen = [r for r in records if keys is None or r.key in keys]
    return sorted(chosen, key=lambda r: (r.partition, r.offset))


def _read(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    """The gateway publishes a Step (acks=all) before its client has the answer: once a call
    returned, its Step is on the topic."""
    return asyncio.run(topic_reads.records(bootstrap, topic))


def check_exact_tokens(engine: EngineProcess, step: Step, tokenizer: Any, text: str) -> None:
    """The Step's prompt ids are the engine's rendering of its request, its response ids the
    text the agent received."""
    request = step.request.model_dump(mode="json", exclude_none=True)
    tokenized = httpx.post(
        f"{engine.base_url}/tokenize",
        json={
            "model": "policy",
            "messages": request["messages"],
            "tools": request.get("tools"),
            "chat_template_kwargs": request["extra"].get("chat_template_kwargs"),
        },
        timeout=60,
    ).json()
    assert step.prompt_token_ids == tokenized["tokens"]
    assert tokenizer.decode(step.response_token_ids, skip_special_tokens=True) == text


def read_steps(bootstrap: str, session_ids: set[str] | None = None) -> list[Step]:
    records = _of_sessions(_read(bootstrap, "claw.steps"), session_ids)
    return [decode_event(Step, r.value) for r in records]


def read_session_events(bootstrap: str, session_ids: set[str]) -> list[SessionEvent]:
    """Each session's events in its own order (a session's events share one partition)."""
    records = _of_sessions(_read(bootstrap, "claw.session-events"), session_ids)
    events = [decode_event(SessionEvent, r.value) for r in records]
    return sorted(events, key=lambda e: e.created_at)


def read_dead_letters(bootstrap: str, session_ids: set[str]) -> list[DeadLetter]:
    records = _of_sessions(_read(bootstrap, "claw.dlq"), session_ids)
    return [decode_event(DeadLetter, r.value) for r in records]
