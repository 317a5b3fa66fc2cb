"""The built-in engine through the official `openai` client: real SmolLM2-135M, real HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..support.engine import EngineProcess

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def engine(smollm2: Path, tmp_path_factory: pytest.TempPathFactory):
    proc = EngineProcess(smollm2, tmp_path_factory.mktemp("engine"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def reference(smollm2: Path):
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2)


def forward_logprobs(model, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
    """Teacher-forced log-probabilities of response_ids after prompt_ids."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), -1)
    positions = range(len(prompt_ids) - 1, len(prompt_ids) + len(response_ids) - 1)
    return [float(logprobs[p, t]) for p, t in zip(positions, response_ids, strict=True)]


def client(engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.base_url + "/v1", api_key="unused", max_retries=0)


def test_non_stream_tokens_text_and_logprobs_agree(engine, reference) -> None:
    model, tokenizer = reference
    response = client(engine).chat.completions.create(
        model="smollm2-135m",
        messages=QUESTION,
        max_tokens=24,
        temperature=1.0,
        seed=7,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    choice = response.choices[0]
    token_ids = choice.model_extra["token_ids"]
    prompt_ids = response.model_extra["prompt_token_ids"]
    assert len(token_ids) == response.usage.completion_tokens == len(choice.logprobs.content)
    assert len(prompt_ids) == response.usage.prompt_tokens
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == choice.message.content
    expected = forward_logprobs(model, prompt_ids, token_ids)
    got = [entry.logprob for entry in choice.logprobs.content]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-3
    assert all(len(entry.top_logprobs) == 3 for entry in choice.logprobs.content)
    assert response.model_extra["weight_version"] == 0


async def test_concurrent_requests_are_batched_and_each_is_exact(engine, reference) -> None:
    model, tokenizer = reference
    aclient = openai.AsyncOpenAI(base_url=engine.base_url + "/v1", api_key="unused", max_retries=0)
    prompts = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Write one sentence about the sea and the wind at night."}],
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe"},
                    {"type": "text", "text": "a cat."},
                ],
            }
        ],
    ]
    responses = await asyncio.gather(
        *[
            aclient.chat.completions.create(
                model="smollm2-135m",
                messages=m,
                max_tokens=20,
                temperature=0.8,
                seed=i,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            for i, m in enumerate(prompts)
        ]
    )
    for response in responses:
        choice = response.choices[0]
        token_ids = choice.model_extra["token_ids"]
        assert tokenizer.decode(token_ids, skip_special_tokens=True) == choice.message.content
        expected = forward_logprobs(model, response.model_extra["prompt_token_ids"], token_ids)
        got = [entry.logprob for entry in choice.logprobs.content]
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-3


def test_stream_is_token_by_token_with_ids_and_usage(engine, reference) -> None:
    _, tokenizer = reference
    stream = client(engine).chat.completions.create(
        model="smollm2-135m",
        messages=QUESTION,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    assert chunks[0].model_extra.get("prompt_token_ids")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = [
        t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])
    ]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 5  # real token-by-token streaming
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(ids)
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals in (["stop"], ["length"])
    # greedy: same text as the non-stream answer
    again = client(engine).chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=20, temperature=0
    )
    assert again.choices[0].message.content == text


def test_prompt_logprobs_equal_the_forward_pass(engine, reference) -> None:
    model, tokenizer = reference
    prompt_ids = tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]
    body = {"model": "smollm2-135m", "prompt": prompt_ids, "max_tokens": 0, "prompt_logprobs": 2}
    response = httpx.post(engine.base_url + "/v1/completions", json=body, timeout=60).json()
    entries = response["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(prompt_ids)
    expected = forward_logprobs(model, prompt_ids[:1], prompt_ids[1:])
    for position, (entry, want) in enumerate(zip(entries[1:], expected, strict=True), start=1):
        actual = entry[str(prompt_ids[position])]
        assert abs(actual["logprob"] - want) < 1e-3
        assert actual["rank"] >= 1 and "decoded_token" in actual
    assert response["choices"][0]["text"] == ""
    assert response["usage"]["completion_tokens"] == 0


def test_completions_take_text_and_return_vllm_logprobs(engine) -> None:
    body = {
        "model": "smollm2-135m",
        "prompt": "Once upon a time",
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": 2,
        "return_token_ids": True,
    }
    response = httpx.post(engine.base_url + "/v1/completions", json=body, timeout=60).json()
    choice = response["choices"][0]
    assert (
        len(choice["token_ids"])
        == len(choice["logprobs"]["tokens"])
        == response["usage"]["completion_tokens"]
    )
    assert choice["prompt_token_ids"] and choice["finish_reason"] in ("length", "stop")
    assert all(len(t) >= 2 for t in choice["logprobs"]["top_logprobs"])


def test_models_and_health(engine) -> None:
    assert httpx.get(engine.base_url + "/health").status_code == 200
    models = client(engine).models.list()
    (card,) = models.data
    assert card.id == "smollm2-135m" and card.model_extra["max_model_len"] == 8192


def test_errors_are_openai_shaped(engine) -> None:
    c = client(engine)
    long_text = "hello " * 9000
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": long_text}]
        )
    message = info.value.body["message"]
    assert "maximum context length is 8192 tokens" in message and "input tokens" in message
    n_prompt = int(message.split("your request has ")[1].split(" ")[0])
    assert n_prompt > 8192
    with pytest.raises(openai.BadRequestError, match="too large: 8200"):
        c.chat.completions.create(model="smollm2-135m", messages=QUESTION, max_tokens=8200)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.chat.completions.create(model="gpt-9", messages=QUESTION)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.chat.completions.create(model="smollm2-135m", messages=QUESTION, temperature=5)
    with pytest.raises(openai.BadRequestError, match="less than or equal to 16"):
        c.chat.completions.create(model="smollm2-135m", messages=QUESTION, n=17)
    raw = httpx.post(
        engine.base_url + "/v1/chat/completions",
        content=b"{nope",
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert raw.status_code == 400
    error = raw.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    assert "JSON" in error["message"]
    bad_ids = httpx.post(
        engine.base_url + "/v1/completions", json={"prompt": [10**7], "max_tokens": 1}, timeout=60
    )
    assert bad_ids.status_code == 400 and "vocabulary" in bad_ids.json()["error"]["message"]


def test_cancelled_stream_frees_the_engine(engine) -> None:
    with httpx.stream(
        "POST",
        engine.base_url + "/v1/chat/completions",
        json={"messages": QUESTION, "max_tokens": 400, "stream": True, "temperature": 1.0},
        timeout=60,
    ) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break
    metrics = ""
    for _ in range(50):
        metrics = httpx.get(engine.base_url + "/metrics").text
        if "claw_engine_running_requests 0.0" in metrics:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert "claw_engine_running_requests 0.0" in metrics
    json.loads(httpx.get(engine.base_url + "/v1/models").text)


def test_a_conversation_resent_whole_reuses_its_prefix(engine, reference) -> None:
    """An agent resends its system prompt and history on every call: the second call reports
    the shared prefix in vLLM's `cached_tokens`, its logprobs stay those of a full forward
    pass, and /metrics counts the hit."""
    model, _ = reference
    system = {"role": "system", "content": "You are a terse assistant. " * 40}
    first = [system, {"role": "user", "content": "Say hello."}]
    second = [
        *first,
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again."},
    ]

    def call(messages):
        return client(engine).chat.completions.create(
            model="smollm2-135m",
            messages=messages,
            max_tokens=8,
            temperature=0.0,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )

    def hits() -> float:
        metrics = httpx.get(engine.base_url + "/metrics").text
        line = next(
            x for x in metrics.splitlines() if x.startswith("claw_engine_prefix_cache_hits_total")
        )
        return float(line.split()[-1])

    before = hits()
    call(first)
    response = call(second)
    cached = response.usage.prompt_tokens_details.cached_tokens
    assert cached >= 256 and cached % 64 == 0, response.usage
    assert cached < response.usage.prompt_tokens
    prompt_ids = response.model_extra["prompt_token_ids"]
    token_ids = response.choices[0].model_extra["token_ids"]
    expected = forward_logprobs(model, prompt_ids, token_ids)
    got = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-3
    assert hits() - before >= cached


def test_n_choices_are_sampled_from_one_prompt(engine, reference) -> None:
    """vLLM's `n`: one request, n choices, each with its own token ids and exact logprobs;
    the prompt counted once in the usage."""
    model, _ = reference
    response = client(engine).chat.completions.create(
        model="smollm2-135m",
        messages=QUESTION,
        max_tokens=12,
        temperature=1.0,
        seed=11,
        n=3,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    prompt_ids = response.model_extra["prompt_token_ids"]
    answers = []
    for choice in response.choices:
        token_ids = choice.model_extra["token_ids"]
        answers.append(tuple(token_ids))
        expected = forward_logprobs(model, prompt_ids, token_ids)
        got = [entry.logprob for entry in choice.logprobs.content]
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-3
    assert len(set(answers)) > 1  # three seeds, three samples
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == sum(len(a) for a in answers)
    completions = httpx.post(
        engine.base_url + "/v1/completions",
        json={"model": "smollm2-135m", "prompt": "The sea is", "max_tokens": 4, "n": 2, "seed": 3},
        timeout=60,
    ).json()
    assert [c["index"] for c in completions["choices"]] == [0, 1]
    streamed = httpx.post(
        engine.base_url + "/v1/chat/completions",
        json={"model": "smollm2-135m", "messages": QUESTION, "n": 2, "stream": True},
        timeout=60,
    )
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "n"
