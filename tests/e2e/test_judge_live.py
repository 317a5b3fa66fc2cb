"""The judge and the teacher on the real SmolLM2-135M behind the real built-in engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from claw_stream.events import (
    ChatMessage,
    SamplingParams,
    SessionEvent,
    Step,
    StepRequest,
    StepResponse,
    Usage,
)
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.judge_client import JudgeClient
from claw_stream.worker.logic.turns import stitch_session

from ..support.engine import EngineProcess
from ..support.worker import WorkerEnv, new_id, private_worker

QUESTION = [
    ChatMessage(role="system", content="You answer briefly."),
    ChatMessage(role="user", content="What is the capital of France?"),
]


@pytest.fixture(scope="module")
def engine(smollm2: Path, tmp_path_factory: pytest.TempPathFactory):
    proc = EngineProcess(smollm2, tmp_path_factory.mktemp("judge-engine"))
    yield proc
    proc.stop()


def sampled_step(engine: EngineProcess, session_id: str, index: int, messages) -> Step:
    """A Step built the gateway's way: exactly the sampled ids and their logprobs."""
    body = httpx.post(
        f"{engine.base_url}/v1/chat/completions",
        json={
            "model": "smollm2-135m",
            "messages": [m.model_dump(exclude_none=True) for m in messages],
            "max_tokens": 16,
            "temperature": 1.0,
            "seed": 3,
            "logprobs": True,
            "return_token_ids": True,
        },
        timeout=60,
    ).json()
    choice = body["choices"][0]
    return Step(
        session_id=session_id,
        turn_index=index,
        request=StepRequest(model="smollm2-135m", messages=messages, sampling=SamplingParams()),
        response=StepResponse(
            message=ChatMessage(role="assistant", content=choice["message"]["content"]),
            finish_reason=choice["finish_reason"],
        ),
        prompt_token_ids=body["prompt_token_ids"],
        response_token_ids=choice["token_ids"],
        response_logprobs=[c["logprob"] for c in choice["logprobs"]["content"]],
        weight_version=body.get("weight_version", 0),
        engine=engine.base_url,
        latency_ms=1.0,
        usage=Usage(
            **{k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        ),
    )


async def test_teacher_scores_exactly_the_sampled_tokens(engine: EngineProcess) -> None:
    step = await asyncio.to_thread(sampled_step, engine, "s-live", 0, QUESTION)
    client = JudgeClient(WorkerSettings(judge_url=engine.base_url + "/v1"))
    try:
        messages = [m.model_dump(exclude_none=True) for m in QUESTION]
        async with httpx.AsyncClient() as http:
            tokenized = (
                await http.post(f"{engine.base_url}/tokenize", json={"messages": messages})
            ).json()
        assert tokenized["tokens"] == step.prompt_token_ids  # the same chat template
        # unchanged prompt: the scores are the behaviour logprobs of the sampled tokens
        scored = await client.score(messages, None, step.response_token_ids)
        assert max(abs(a - b) for a, b in zip(scored, step.response_logprobs, strict=True)) < 1e-3
        (turn,) = stitch_session([step], closed="session_ended")
        teacher = await client.teacher_logprobs(turn, "Answer with one word.")
        assert len(teacher) == len(step.response_token_ids) and teacher != scored
    finally:
        await client.aclose()


async def test_smollm2_judges_a_session_end_to_end(
    engine: EngineProcess, broker, postgres, tmp_path_factory
) -> None:
    worker, topics, url = await private_worker(
        broker,
        postgres,
        tmp_path_factory.mktemp("live-worker"),
        "live",
        judge_url=engine.base_url + "/v1",
        prm_votes=2,
        judge_max_tokens=24,
    )
    env = WorkerEnv(broker, url, topics, None, worker)
    try:
        sid = new_id("smol")
        first = await asyncio.to_thread(sampled_step, engine, sid, 0, QUESTION)
        reply = ChatMessage(role="user", content="Correct, thank you!")
        second = await asyncio.to_thread(
            sampled_step, engine, sid, 1, [*QUESTION, first.response.message, reply]
        )
        await env.steps([first, second])
        await env.events(SessionEvent(session_id=sid, kind="ended", n_steps=2))
        rows = await env.assembled(sid)
        assert len(rows) == 2
        (judgement,) = await env.db(
            "SELECT judge_model, payload FROM judgements WHERE step_id = $1", first.step_id
        )
        payload = json.loads(judgement["payload"])
        assert judgement["judge_model"] == "smollm2-135m"
        assert len(payload["prm_raw"]) == 2 and all(payload["prm_raw"])  # SmolLM2's own words
        assert payload["turn"]["next_state"] == [reply.model_dump()]
    finally:
        worker.stop()
