"""Tool calls, live weight swaps under load, and LoRA adapters, on tiny models trained to say
something recognisable (so a change of weights is visible in the output)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from ..support.engine import ADMIN_KEY, PROMPT, TOOL_PROMPT, WEATHER_TOOL, EngineProcess

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def alpha_engine(tiny_models, tmp_path_factory):
    proc = EngineProcess(
        tiny_models["alpha"], tmp_path_factory.mktemp("alpha"), "--served-model-name", "policy"
    )
    yield proc
    proc.stop()


def say(engine: EngineProcess, model: str = "policy") -> tuple[str, int]:
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=PROMPT, temperature=0, max_tokens=12
    )
    response = raw.parse()
    assert int(raw.headers["x-claw-weight-version"]) == response.model_extra["weight_version"]
    return response.choices[0].message.content, response.model_extra["weight_version"]


def load_weights(
    engine: EngineProcess, path: Path, version: int | None = None, key: str = ADMIN_KEY
) -> httpx.Response:
    body = {"path": str(path)} | ({"version": version} if version is not None else {})
    return httpx.post(
        engine.base_url + "/admin/load_weights",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def test_tool_calls_non_stream_and_stream(tiny_models, tmp_path) -> None:
    engine = EngineProcess(tiny_models["tools"], tmp_path)
    try:
        client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="x", max_retries=0)
        response = client.chat.completions.create(
            model=tiny_models["tools"].name,
            messages=TOOL_PROMPT,
            tools=[WEATHER_TOOL],
            temperature=0,
        )
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        assert not choice.message.content

        stream = client.chat.completions.create(
            model=tiny_models["tools"].name,
            messages=TOOL_PROMPT,
            tools=[WEATHER_TOOL],
            temperature=0,
            stream=True,
        )
        chunks = list(stream)
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert [d.function.name for d in deltas] == ["get_weather"]
        assert json.loads(deltas[0].function.arguments) == {"city": "Paris"}
        assert not "".join(
            c.choices[0].delta.content or "" for c in chunks if c.choices
        )  # no raw markup leaked
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # the history with the call and its result renders back into a prompt
        follow = client.chat.completions.create(
            model=tiny_models["tools"].name,
            messages=[
                *TOOL_PROMPT,
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
            ],
            tools=[WEATHER_TOOL],
            max_tokens=5,
        )
        assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        engine.stop()


def test_weight_swap_under_load_fails_nothing_and_serves_new_weights(
    alpha_engine, tiny_models
) -> None:
    assert say(alpha_engine)[0] == "alpha alpha alpha"
    results: list[tuple[float, float, int, str]] = []
    spanned: list[list[int]] = []
    failures: list[str] = []

    done = asyncio.Event()

    async def client_loop() -> None:
        async with httpx.AsyncClient(base_url=alpha_engine.base_url, timeout=60) as c:
            while not done.is_set():
                sent = time.monotonic()
                r = await c.post(
                    "/v1/chat/completions",
                    json={
                        "model": "policy",
                        "messages": PROMPT,
                        "temperature": 0,
                        "max_tokens": 12,
                    },
                )
                if r.status_code != 200:
                    failures.append(r.text)
                    continue
                body = r.json()
                if body.get("token_weight_versions"):  # this response spanned a swap
                    spanned.append(body["token_weight_versions"])
                    continue
                results.append(
                    (
                        sent,
                        time.monotonic(),
                        body["weight_version"],
                        body["choices"][0]["message"]["content"],
                    )
                )

    async def answered_by(version: int) -> None:
        """Until a call was answered whole by `version` (under load a fixed window of 5 s
        saw the swaps but no answer after them)."""
        deadline = time.monotonic() + 60
        while not any(v == version for *_, v, _ in results):
            assert time.monotonic() < deadline, f"no answer of v{version}: {failures}"
            await asyncio.sleep(0.05)

    async def swapper() -> list[tuple[float, int]]:
        swaps = []
        try:
            await answered_by(0)
            async with httpx.AsyncClient(base_url=alpha_engine.base_url, timeout=60) as c:
                for version, path in (
                    (1, tiny_models["bravo"]),
                    (2, tiny_models["alpha"]),
                    (3, tiny_models["bravo"]),
                ):
                    r = await c.post(
                        "/admin/load_weights",
                        json={"path": str(path), "version": version},
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                    )
                    assert r.status_code == 200, r.text
                    swaps.append((time.monotonic(), r.json()["weight_version"]))
                    await answered_by(version)
        finally:
            done.set()
        return swaps

    async def main() -> list[tuple[float, int]]:
        *_, swaps = await asyncio.gather(*[client_loop() for _ in range(6)], swapper())
        return swaps

    swaps = asyncio.run(main())
    assert failures == []
    assert [v for _, v in swaps] == [1, 2, 3]
    assert {v for *_, v, _ in results} >= {0, 1, 2, 3}
    expected = {
        0: "alpha alpha alpha",
        1: "bravo bravo bravo",
        2: "alpha alpha alpha",
        3: "bravo bravo bravo",
    }
    for _, _, version, text in results:
        assert text == expected[version], (version, text)
    for versions in spanned:  # per-token versions never go backwards
        assert versions == sorted(versions) and len(set(versions)) > 1
    # a request sent after a swap completed is served by the new weights (or newer)
    for swapped_at, version in swaps:
        later = [v for sent, _, v, _ in results if sent > swapped_at]
        assert all(v >= version for v in later)
    assert say(alpha_engine) == ("bravo bravo bravo", 3)


def test_load_weights_needs_the_admin_key_and_a_newer_version(alpha_engine, tiny_models) -> None:
    assert load_weights(alpha_engine, tiny_models["alpha"], key="wrong").status_code == 401
    current = say(alpha_engine)[1]
    stale = load_weights(alpha_engine, tiny_models["alpha"], version=current)
    assert stale.status_code == 409 and "not newer" in stale.json()["error"]["message"]
    missing = load_weights(alpha_engine, tiny_models["alpha"] / "nowhere")
    assert missing.status_code == 404
    ok = load_weights(alpha_engine, tiny_models["alpha"])
    assert ok.status_code == 200 and ok.json()["weight_version"] == current + 1
    assert say(alpha_engine) == ("alpha alpha alpha", current + 1)


def test_lora_adapter_load_select_unload(alpha_engine, tiny_models) -> None:
    base_text, _ = say(alpha_engine)
    body = {"lora_name": "charlie", "lora_path": str(tiny_models["charlie"])}
    url = alpha_engine.base_url + "/v1/load_lora_adapter"
    for refused in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {ADMIN_KEY}x"},
    ):
        r = httpx.post(url, json=body, headers=refused, timeout=60)
        assert r.status_code == 401, refused  # the admin key swaps weights
        assert r.json()["error"]["message"].startswith("admin key required")
    assert httpx.get(alpha_engine.base_url + "/v1/models").json()["data"][1:] == []
    r = httpx.post(url, json=body, headers=ADMIN, timeout=60)
    assert r.status_code == 200 and "added successfully" in r.text
    again = httpx.post(url, json=body, headers=ADMIN, timeout=60)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    ids = [m["id"] for m in httpx.get(alpha_engine.base_url + "/v1/models").json()["data"]]
    assert ids == ["policy", "charlie"]
    text, version = say(alpha_engine, "charlie")
    assert text == "charlie charlie charlie"
    assert version == say(alpha_engine)[1]  # an unversioned adapter reports the base version
    assert say(alpha_engine, "policy")[0] == base_text  # the base model is untouched

    async def mixed() -> list[str]:
        async with httpx.AsyncClient(base_url=alpha_engine.base_url, timeout=60) as c:
            rs = await asyncio.gather(
                *[
                    c.post(
                        "/v1/chat/completions",
                        json={"model": m, "messages": PROMPT, "temperature": 0, "max_tokens": 12},
                    )
                    for m in ["policy", "charlie"] * 4
                ]
            )
        return [r.json()["choices"][0]["message"]["content"] for r in rs]

    assert asyncio.run(mixed()) == [base_text, "charlie charlie charlie"] * 4
    unload = alpha_engine.base_url + "/v1/unload_lora_adapter"
    for refused in ({}, {"Authorization": "Bearer wrong"}):
        assert httpx.post(unload, json={"lora_name": "charlie"}, headers=refused).status_code == 401
    assert say(alpha_engine, "charlie")[0] == "charlie charlie charlie"  # still loaded
    r = httpx.post(unload, json={"lora_name": "charlie"}, headers=ADMIN)
    assert r.status_code == 200
    gone = httpx.post(
        alpha_engine.base_url + "/v1/chat/completions",
        json={"model": "charlie", "messages": PROMPT},
        timeout=60,
    )
    assert gone.status_code == 404
    missing = httpx.post(unload, json={"lora_name": "charlie"}, headers=ADMIN)
    assert missing.status_code == 404


def test_open_lora_routes_take_no_key_and_weights_still_do(tiny_models, tmp_path) -> None:
    """`engine.open_lora_routes` keeps vLLM's open LoRA routes, for clients written against
    them; a full weight swap still needs the admin key."""
    engine = EngineProcess(
        tiny_models["alpha"],
        tmp_path,
        "--served-model-name",
        "policy",
        env={"CLAW_ENGINE__OPEN_LORA_ROUTES": "true"},
    )
    try:
        body = {"lora_name": "charlie", "lora_path": str(tiny_models["charlie"])}
        r = httpx.post(engine.base_url + "/v1/load_lora_adapter", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert say(engine, "charlie")[0] == "charlie charlie charlie"
        r = httpx.post(engine.base_url + "/v1/unload_lora_adapter", json={"lora_name": "charlie"})
        assert r.status_code == 200, r.text
        assert load_weights(engine, tiny_models["alpha"], key="wrong").status_code == 401
        no_key = httpx.post(
            engine.base_url + "/admin/load_weights", json={"path": str(tiny_models["alpha"])}
        )
        assert no_key.status_code == 401
    finally:
        engine.stop()
