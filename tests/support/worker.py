"""Real Faust worker processes, a judge whose answers the test controls, scripted steps."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from claw_stream.bus.kafka import make_producer, publish
from claw_stream.bus.topics import apply_topics, specs_for
from claw_stream.events import (
    ChatMessage,
    Event,
    Sample,
    SamplingParams,
    SessionEvent,
    Step,
    StepRequest,
    StepResponse,
    Turn,
    Usage,
)
from claw_stream.names import Topics
from claw_stream.store.db import asyncpg_dsn
from claw_stream.worker.logic.judge_prompts import OPD_SYSTEM

from . import topic_reads
from .app_thread import AppThread
from .postgres import new_database
from .processes import ChildService, child_env, free_port
from .service_logs import watch

E = TypeVar("E", bound=Event)


def worker_topics(prefix: str) -> Topics:
    """Topic names private to one test module."""
    return Topics(**{role: f"{prefix}.{name}" for role, name in Topics().by_role().items()})


async def create_topics(bootstrap: str, prefix: str) -> Topics:
    """As specified: the worker and the trainer write nothing to a topic that differs from its
    spec (bus/guard.py)."""
    topics = worker_topics(prefix)
    await apply_topics(bootstrap, specs_for(topics))
    return topics


def topics_env(topics: Topics) -> dict[str, str]:
    """The environment that points a service at these topics."""
    return {f"CLAW_TOPICS__{role.upper()}": name for role, name in topics.by_role().items()}


# --- the judge ------------------------------------------------------------------------------


def _stopped(text: str, stop: str | list[str] | None) -> tuple[str, str | None]:
    """`text` ended before the first stop string it holds, and that string (vLLM's way)."""
    stops = [stop] if isinstance(stop, str) else stop or []
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return text, None
    at, met = min(found)
    return text[:at], met


class JudgeStub:
    """An OpenAI/vLLM-protocol server on a free port whose answers follow the next state:
    'thanks' -> \\boxed{1}, 'wrong' or 'error' -> \\boxed{-1}, 'SLOW' -> no answer in time,
    'sluggish' -> none to the first request, otherwise \\boxed{0}. OPD: a hint when the next
    state says 'wrong'. The first `busy` chat requests are answered 503 (an overloaded
    server). It honours `stop` as vLLM does: an answer ends before the first stop string it
    holds, named in the choice's `stop_reason`, and `max_tokens` (a word a token): an answer cut
    there ends with `length`. `thinks`: a draft box in `<think>` comes first; `reasons_apart`:
    a long thinking (320 words, no box) in the message's `reasoning_content`, as vLLM's
    reasoning parser hands it; `names_stop=False`: no `stop_reason`, as a hosted API answers."""

    def __init__(
        self,
        slow_s: float = 30.0,
        max_n: int = 16,
        busy: int = 0,
        thinks: bool = False,
        names_stop: bool = True,
        reasons_apart: bool = False,
    ):
        self.thinks = thinks
        self.reasons_apart = reasons_apart
        self.names_stop = names_stop  # False: like a hosted API, no `stop_reason`
        self.slow_s = slow_s
        self.max_n = max_n
        self.busy = busy
        self.calls: dict[str, int] = {}  # requests by route (prm, opd, tokenize, completions)
        self.votes = 0  # chat answers given: a request with n answers counts n
        self.bodies: list[dict[str, Any]] = []  # every chat request, as sent
        self.tokenized: list[dict[str, Any]] = []  # every /tokenize request, as sent
        self.asked: dict[str, int] = {}  # chat requests by next state
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        app = FastAPI()

        def count(route: str) -> None:
            self.calls[route] = self.calls.get(route, 0) + 1

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "judge", "object": "model"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            if self.busy > 0:
                self.busy -= 1
                error = {"message": "overloaded", "type": "server_error", "code": 503}
                return JSONResponse({"error": error}, status_code=503)
            system, transcript = body["messages"][0]["content"], body["messages"][-1]["content"]
            following = " ".join(re.findall(r"\[next state: \w+\] (.*)", transcript)).lower()
            count("opd" if system == OPD_SYSTEM else "prm")
            self.asked[following] = self.asked.get(following, 0) + 1
            # "sluggish": no answer in time to the first request, then answers
            if "slow" in following or ("sluggish" in following and self.asked[following] == 1):
                await asyncio.sleep(self.slow_s)
            if system == OPD_SYSTEM:
                text = (
                    "\\boxed{1} [HINT_START]Answer in one short sentence.[HINT_END]"
                    if "wrong" in following
                    else "\\boxed{-1}"
                )
            elif "thanks" in following:
                text = "The user is satisfied. \\boxed{1}"
            elif "wrong" in following or "error" in following:
                text = "A correction. \\boxed{-1}"
            else:
                text = "Unclear. \\boxed{0}"
            if self.thinks:  # a draft box in its thinking, then the verdict
                text = f"<think>At first sight \\boxed{{0}}, but let me see.</think> {text}"
            text += " Is there anything else I can judge?"  # what a model goes on with
            reasoning = "Let me read what the user said next. " * 40 if self.reasons_apart else ""
            text, met = _stopped(text, body.get("stop"))
            finish = "stop"
            room = int(body.get("max_tokens") or 1 << 30)
            if len(reasoning.split()) > room:  # cut in its thinking
                reasoning, text, met, finish = (
                    " ".join(reasoning.split()[:room]),
                    "",
                    None,
                    "length",
                )
            elif len(reasoning.split()) + len(text.split()) > room:
                text = " ".join(text.split()[: room - len(reasoning.split())])
                met, finish = None, "length"
            message = {"role": "assistant", "content": text}
            if reasoning:
                message["reasoning_content"] = reasoning.strip()
            n = min(int(body.get("n") or 1), self.max_n)  # max_n 1: a server that ignores n
            self.votes += n
            return {
                "id": "chatcmpl-judge",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "judge"),
                "choices": [
                    {
                        "index": i,
                        "message": message,
                        "finish_reason": finish,
                        **({"stop_reason": met} if self.names_stop else {}),
                    }
                    for i in range(n)
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

        @app.post("/tokenize")
        async def tokenize(request: Request) -> dict[str, Any]:
            count("tokenize")
            body = await request.json()
            self.tokenized.append(body)
            return {"count": 3, "max_model_len": 8192, "tokens": self.tokens_of(body["messages"])}

        @app.post("/v1/completions")
        async def completions(request: Request) -> dict[str, Any]:
            body = await request.json()
            count("completions")
            prompt = body["prompt"]
            entries = [None] + [
                {str(t): {"logprob": -0.25, "rank": 1, "decoded_token": "x"}} for t in prompt[1:]
            ]
            return {
                "id": "cmpl-judge",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model", "judge"),
                "choices": [
                    {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": entries}
                ],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": 1},
            }

        self.served = AppThread(app, self.port)

    @staticmethod
    def tokens_of(messages: list[dict[str, Any]]) -> list[int]:
        """The three token ids its template renders these messages to: the same messages, the
        same ids."""
        digest = hashlib.blake2b(json.dumps(messages, sort_keys=True).encode(), digest_size=3)
        return [1 + b for b in digest.digest()]

    def stop(self) -> None:
        self.served.stop()


# --- the worker -----------------------------------------------------------------------------


class WorkerProcess(ChildService):
    """`claw-stream worker` as a child process; kill() is a SIGKILL."""

    def __init__(
        self,
        bootstrap: str,
        database_url: str,
        data_dir: Path,
        topics: Topics | None = None,
        env: dict[str, str] | None = None,
        **worker: Any,
    ):
        self.data_dir = data_dir
        self._given = (bootstrap, database_url, topics, env, worker)
        self.env = child_env(
            CLAW_KAFKA_BOOTSTRAP=bootstrap,
            CLAW_DATABASE_URL=database_url,
            CLAW_DATA_DIR=str(data_dir),
            **(topics_env(topics) if topics is not None else {}),
            **{f"CLAW_WORKER__{k.upper()}": str(v) for k, v in worker.items()},
            **(env or {}),
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def beside(self, data_dir: Path, **changed: Any) -> WorkerProcess:
        """Another worker with this one's settings (its app id, so the same consumer group, its
        topics, its database, its judge), `changed` worker settings on top (a metrics port of
        its own), and a data dir of its own; started now."""
        bootstrap, database_url, topics, env, worker = self._given
        return WorkerProcess(
            bootstrap, database_url, data_dir, topics, env, **{**worker, **changed}
        )

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = watch(f"worker {self.data_dir.name}", self.data_dir / "worker.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "claw_stream", "worker"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )

    def log(self) -> str:
        return (self.data_dir / "worker.log").read_text(errors="replace")[-4000:]

    def check(self) -> None:
        """Fail with the worker's log when it died."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log()}")

    def stop(self) -> None:
        try:
            super().stop()
        except subprocess.TimeoutExpired:
            self.kill()


async def private_worker(
    broker: str,
    postgres: Any,
    data_dir: Path,
    label: str,
    env: dict[str, str] | None = None,
    **worker: Any,
) -> tuple[WorkerProcess, Topics, str]:
    """A worker on topics, a consumer group and a database of its own: (worker, topics, url);
    `env` sets more of its settings (other sections than `worker`)."""
    prefix = new_id(label)
    topics = await create_topics(broker, prefix)
    url = await asyncio.to_thread(new_database, postgres, label)
    settings = {"app_id": prefix, "sweep_interval_s": 0.5, **worker}
    return WorkerProcess(broker, url, data_dir, topics, env, **settings), topics, url


# --- scripted traffic -----------------------------------------------------------------------


_SAMPLED: dict[str, list[int]] = {}  # an answer's ids as its step sampled them


def message_ids(message: ChatMessage) -> list[int]:
    """A message's token ids as a chat template would render it into a prompt: an answer as it
    was sampled, any other message three ids of its own; so a step's prompt continues the
    previous step's prompt and answer ids wherever its messages continue them, as an engine's
    does (the worker checks: `stitch.token_drift`)."""
    key = message.model_dump_json()
    if key in _SAMPLED:
        return _SAMPLED[key]
    digest = hashlib.blake2b(key.encode(), digest_size=3).digest()
    return [1000 + b for b in digest]


def step(
    session_id: str,
    index: int,
    messages: list[ChatMessage],
    answer: ChatMessage,
    *,
    turn_type: str = "main",
    weight_version: int = 0,
) -> Step:
    n = 3 + index % 3
    response = [100 + i for i in range(n)]
    _SAMPLED[answer.model_dump_json()] = response
    prompt = [1, *(i for m in messages for i in message_ids(m))]
    return Step(
        session_id=session_id,
        turn_type=turn_type,  # type: ignore[arg-type]
        turn_index=index,
        request=StepRequest(
            model="policy", messages=messages, sampling=SamplingParams(temperature=1.0)
        ),
        response=StepResponse(
            message=answer, finish_reason="tool_calls" if answer.tool_calls else "stop"
        ),
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * n,
        weight_version=weight_version,
        engine="test",
        latency_ms=1.0,
        usage=Usage(prompt_tokens=len(prompt), completion_tokens=n, total_tokens=len(prompt) + n),
    )


def chat(session_id: str, replies: list[str], weight_version: int = 0) -> list[Step]:
    """A conversation whose user says each of `replies` in turn (the first is the task)."""
    history: list[ChatMessage] = [ChatMessage(role="system", content="You are helpful.")]
    steps = []
    for k, text in enumerate(replies):
        history = [*history, ChatMessage(role="user", content=text)]
        answer = ChatMessage(role="assistant", content=f"answer {k} of {session_id}")
        steps.append(step(session_id, k, history, answer, weight_version=weight_version))
        history = [*history, answer]
    return steps


async def send(bootstrap: str, topic: str, events: list[Event | bytes], key: str = "") -> None:
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        for event in events:
            if isinstance(event, bytes):
                await producer.send_and_wait(topic, event, key=key.encode())
            else:
                await publish(producer, topic, getattr(event, "session_id", "") or key, event)
    finally:
        await producer.stop()


async def read_topic(bootstrap: str, topic: str) -> list[bytes]:
    """Every record now on `topic`, in partition order (read on from where the last read of it
    ended: topic_reads)."""
    return [r.value for r in await topic_reads.records(bootstrap, topic)]


async def wait_for(
    probe: Callable[[], Any], what: str, timeout_s: float = 90.0, every_s: float = 0.5
) -> Any:
    """Await probe() until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(every_s)


async def events_on(bootstrap: str, topic: str, model: type[E]) -> list[E]:
    return await topic_reads.events(bootstrap, topic, model)


def new_id(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


@dataclass
class WorkerEnv:
    """A worker of a test's own on its own topics and database, and what it wrote."""

    bootstrap: str
    database_url: str
    topics: Topics
    judge: JudgeStub | None
    worker: WorkerProcess

    async def db(self, query: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(asyncpg_dsn(self.database_url))
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    async def steps(self, steps: list[Any]) -> None:
        await send(self.bootstrap, self.topics.steps, steps)

    async def events(self, *events: SessionEvent) -> None:
        await send(self.bootstrap, self.topics.session_events, list(events))

    async def end(self, session_id: str, n_steps: int | None, **fields: Any) -> None:
        await self.events(
            SessionEvent(session_id=session_id, kind="ended", n_steps=n_steps, **fields)
        )

    async def samples(self, session_id: str) -> list[Sample]:
        samples = await events_on(self.bootstrap, self.topics.samples, Sample)
        return [s for s in samples if s.session_id == session_id]

    async def turns(self, session_id: str) -> list[Turn]:
        turns = await events_on(self.bootstrap, self.topics.turns, Turn)
        return sorted(
            (t for t in turns if t.session_id == session_id), key=lambda t: t.step.turn_index
        )

    async def assembled(self, session_id: str) -> list[asyncpg.Record]:
        """The session's sample rows once it is assembled (all statuses)."""

        async def probe() -> list[asyncpg.Record] | None:
            self.worker.check()
            rows = await self.db(
                "SELECT assembled_at FROM pipeline_sessions WHERE session_id = $1", session_id
            )
            if not rows or rows[0]["assembled_at"] is None:
                return None
            samples = await self.db(
                "SELECT s.*, t.turn_index FROM samples s JOIN turns t USING (turn_id)"
                " WHERE s.session_id = $1 ORDER BY t.turn_index",
                session_id,
            )
            return (samples,)  # truthy even when the session assembled no sample

        (rows,) = await wait_for(probe, f"session {session_id} assembled", timeout_s=60)
        return rows

    async def published(self, session_id: str, n: int) -> list[Sample]:
        async def probe() -> list[Sample] | None:
            self.worker.check()
            samples = await self.samples(session_id)
            return samples if len(samples) >= n else None

        samples = await wait_for(probe, f"{n} samples of {session_id}", timeout_s=60)
        return sorted(samples, key=lambda s: len(s.prompt_token_ids))  # in turn order
