"""Bad requests cost the engine nothing: oversized bodies, prompts that cannot fit the served
context, and keys over their concurrency limit are refused at the gateway, and the engine's own
request counters show that nothing reached it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest

from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess

MAX_BODY = 8 * 1024 * 1024
CONTEXT = 512  # the tiny test models' max_position_embeddings


@pytest.fixture(scope="module")
def bounded(broker, database, tools_engine, tmp_path_factory):
    proc = GatewayProcess(
        broker,
        database,
        [tools_engine.base_url],
        tmp_path_factory.mktemp("bounded"),
        env={
            "CLAW_GATEWAY__MAX_BODY_BYTES": str(MAX_BODY),
            "CLAW_GATEWAY__MAX_CONCURRENT_PER_KEY": "1",
        },
    )
    yield proc
    proc.stop()


def engine_work(engine_url: str) -> float:
    """Model calls that reached the engine at all (counted on arrival, refused or not) and
    prompt tokens it has prefilled, as one number. `/tokenize` is left out: counting a prompt
    that may or may not fit is what the gateway asks of it."""
    text = httpx.get(engine_url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        arrival = line.startswith("claw_engine_arrivals_total{") and "tokenize" not in line
        if arrival or line.startswith("claw_engine_prompt_tokens_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def ask(gateway: GatewayProcess, content: str, **extra) -> httpx.Response:
    body = {"model": "policy", "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(gateway.base_url + "/v1/chat/completions", json=body, timeout=120)


def test_prompts_that_cannot_fit_never_reach_the_engine(bounded, tools_engine) -> None:
    before = engine_work(tools_engine.base_url)
    huge = ask(bounded, "word " * 1_000_000)  # 5 MB: refused on its size alone
    assert huge.status_code == 400
    error = huge.json()["error"]
    assert error["param"] == "messages"
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]
    assert "at least" in error["message"]  # estimated, not counted
    # a prompt that may or may not fit is counted exactly by the engine's tokenizer
    near = ask(bounded, "word " * 700)
    assert near.status_code == 400
    counted = int(re.search(r"has (\d+) input tokens", near.json()["error"]["message"])[1])
    assert counted >= CONTEXT
    room = ask(bounded, "hello", max_tokens=CONTEXT)
    assert room.status_code == 400 and "'max_tokens'" in room.json()["error"]["message"]
    assert engine_work(tools_engine.base_url) == before  # the engine prefilled nothing
    # and the gateway keeps serving what fits
    assert ask(bounded, "hello", max_tokens=2).status_code == 200
    assert engine_work(tools_engine.base_url) > before


def test_a_body_over_the_limit_is_413_before_it_is_read(bounded, tools_engine) -> None:
    before = engine_work(tools_engine.base_url)
    body = b'{"model": "policy", "messages": [{"role": "user", "content": "' + b"x" * MAX_BODY
    body += b'"}]}'
    r = httpx.post(
        bounded.base_url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413
    assert str(MAX_BODY) in r.json()["error"]["message"]
    for path in ("/rl/set_reward", "/rl/start_session"):
        r = httpx.post(
            bounded.base_url + path,
            content=body,
            headers={"content-type": "application/json", "Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=60,
        )
        assert r.status_code == 413, path
    assert engine_work(tools_engine.base_url) == before
    assert httpx.get(bounded.base_url + "/healthz").status_code == 200


def test_responses_and_messages_that_cannot_fit_never_reach_the_engine(
    bounded, tools_engine
) -> None:
    before = engine_work(tools_engine.base_url)
    text = "word " * 1_000_000
    responses = httpx.post(
        bounded.base_url + "/v1/responses", json={"model": "policy", "input": text}, timeout=120
    )
    assert responses.status_code == 400, responses.text
    assert "maximum context length" in responses.json()["error"]["message"]
    messages = httpx.post(
        bounded.base_url + "/v1/messages",
        json={"model": "claude", "max_tokens": 2, "messages": [{"role": "user", "content": text}]},
        timeout=120,
    )
    assert messages.status_code == 400, messages.text
    assert messages.json()["error"]["type"] == "invalid_request_error"
    assert engine_work(tools_engine.base_url) == before


def test_legacy_completions_that_cannot_fit_never_reach_the_engine(bounded, tools_engine) -> None:
    before = engine_work(tools_engine.base_url)
    url = bounded.base_url + "/v1/completions"
    huge = httpx.post(url, json={"model": "policy", "prompt": "word " * 1_000_000}, timeout=120)
    assert huge.status_code == 400, huge.text
    error = huge.json()["error"]
    assert error["param"] == "prompt" and "at least" in error["message"]
    ids = httpx.post(url, json={"model": "policy", "prompt": [1] * CONTEXT}, timeout=60)
    assert ids.status_code == 400
    assert f"has {CONTEXT} input tokens" in ids.json()["error"]["message"]  # counted exactly
    assert engine_work(tools_engine.base_url) == before
    fits = httpx.post(url, json={"model": "policy", "prompt": "hello", "max_tokens": 2}, timeout=60)
    assert fits.status_code == 200, fits.text
    assert engine_work(tools_engine.base_url) > before


def test_a_chunked_body_over_the_limit_is_413_as_it_arrives(bounded, tools_engine) -> None:
    """No Content-Length to refuse it by: the bytes are counted while they arrive."""
    before = engine_work(tools_engine.base_url)

    def chunked() -> Iterator[bytes]:
        yield b'{"model": "policy", "reward": 1, "messages": [{"role": "user", "content": "'
        for _ in range(MAX_BODY // (1024 * 1024) + 1):
            yield b"x" * (1024 * 1024)
        yield b'"}]}'

    headers = {"content-type": "application/json", "Authorization": f"Bearer {ADMIN_KEY}"}
    for path in ("/v1/chat/completions", "/v1/completions", "/rl/set_reward", "/rl/start_session"):
        r = httpx.post(bounded.base_url + path, content=chunked(), headers=headers, timeout=60)
        assert r.status_code == 413, (path, r.text)
        assert r.json()["error"]["code"] == 413 and str(MAX_BODY) in r.json()["error"]["message"]
    assert engine_work(tools_engine.base_url) == before
    # a chunked body under the limit reaches the route whole
    small = httpx.post(
        bounded.base_url + "/rl/start_session",
        content=iter([b"{", b"}"]),
        headers=headers,
        timeout=60,
    )
    assert small.status_code == 200 and small.json()["api_key"], small.text


def test_a_key_over_its_concurrency_limit_gets_429_with_retry_after(bounded) -> None:
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 48,
        "stream": True,
    }

    async def burst(key: str, n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=bounded.base_url, timeout=120) as client:
            calls = [
                client.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}", "X-Session-Id": f"{key}-{i}"},
                )
                for i in range(n)
            ]
            return await asyncio.gather(*calls)

    answers = asyncio.run(burst("busy-key", 6))
    statuses = sorted(r.status_code for r in answers)
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
    limited = next(r for r in answers if r.status_code == 429)
    assert limited.headers["retry-after"] == "1"
    assert "limit 1" in limited.json()["error"]["message"]
    # the limit is per key: the next call of that key, and another key, go through
    assert [r.status_code for r in asyncio.run(burst("busy-key", 1))] == [200]
    assert [r.status_code for r in asyncio.run(burst("other-key", 1))] == [200]


def test_several_choices_are_refused_on_a_recorded_call(bounded, tools_engine) -> None:
    """The gateway records one Step per call: `n` > 1 is a clear 422 that costs the engine
    nothing (the engine itself serves `n` to its direct clients, such as the judge)."""
    before = engine_work(tools_engine.base_url)
    refused = ask(bounded, "Hi", n=3)
    assert refused.status_code == 422  # as every other body the gateway cannot take
    error = refused.json()["error"]
    assert error["param"] == "n" and "n must be 1" in error["message"], error
    assert engine_work(tools_engine.base_url) == before
    assert ask(bounded, "Hi", n=1, max_tokens=2).status_code == 200
