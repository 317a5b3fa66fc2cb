"""A fast stand-in for vLLM, for benchmarks: same protocol, no model.

Two kinds of answers:
- by default every chat request gets the same 16 tokens, including what the gateway captures
  (`prompt_token_ids`, `choices[].token_ids`, logprobs), stream or not (bench/gateway_bench.py,
  the tests' `stub_upstream`);
- `--conversation` (bench/scale_bench.py): an engine for conversations. Messages are tokenised
  deterministically, a word a token (ids from a hash of the word, inside SmolLM2's vocabulary,
  so the trainer can train on them), in a chat template's shape: a prompt is BOS, each message's
  role id, words and end id, then the assistant's role id; an answer is words and the end id. So
  a session's prompt ids continue its previous prompt and answer ids, as an engine's do (the
  worker's stitch checks it). An answer is 24-64 words drawn from a hash of the conversation,
  given after `--engine-ms` (asleep: no CPU, as a GPU's time would be). Under `/judge` it is a
  PRM judge: the user's next words decide the box ("thanks" 1, "wrong" -1, else 1 or 0 by a
  hash), `n` votes, vLLM's `stop` honoured. It keeps LoRA adapters and base weights as the
  built-in engine does (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`,
  `/admin/load_weights`, `/v1/models` with each one's `weight_version`), so the trainer's pushes
  succeed, and answers 404 for an adapter it does not hold. `GET /stats`: what it was asked.

Run: python bench/stub_upstream.py PORT [--conversation [--engine-ms 300] [--judge-ms 100]]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import re
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from claw_stream.gateway.front_door import read_body
from claw_stream.names import VERSION_HEADER, adapter_version

# compact, as vLLM writes it (FastAPI's JSONResponse, pydantic's model_dump_json)
dumps = functools.partial(json.dumps, separators=(",", ":"))
BODY_LIMIT = 64 * 1024 * 1024
N_TOKENS = 16
TOKENS = [f" tok{i}" for i in range(N_TOKENS)]
PROMPT_IDS = list(range(1, 2049))


def _logprob(token: str) -> dict:
    return {"token": token, "logprob": -0.25, "bytes": list(token.encode()), "top_logprobs": []}


NON_STREAM = dumps(
    {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "prompt_token_ids": PROMPT_IDS,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(TOKENS)},
                "logprobs": {"content": [_logprob(t) for t in TOKENS]},
                "finish_reason": "stop",
                "token_ids": list(range(100, 100 + N_TOKENS)),
            }
        ],
        "usage": {
            "prompt_tokens": len(PROMPT_IDS),
            "completion_tokens": N_TOKENS,
            "total_tokens": len(PROMPT_IDS) + N_TOKENS,
        },
    }
).encode()


def _chunk(delta: dict, **extra: object) -> bytes:
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "policy",
    }
    body["choices"] = [{"index": 0, "delta": delta, **extra}]
    return b"data: " + dumps(body).encode() + b"\n\n"


STREAM = b"".join(
    [
        b"data: "
        + dumps(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "policy",
                "prompt_token_ids": PROMPT_IDS,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            }
        ).encode()
        + b"\n\n",
        *[
            _chunk({"content": t}, token_ids=[100 + i], logprobs={"content": [_logprob(t)]})
            for i, t in enumerate(TOKENS)
        ],
        _chunk({}, finish_reason="stop", token_ids=[]),
        b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":0,"model":"policy","choices":[],"usage":{"prompt_tokens":2048,"completion_tokens":16,"total_tokens":2064}}\n\n',
        b"data: [DONE]\n\n",
    ]
)


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    body = await read_body({}, receive, BODY_LIMIT)
    if scope["path"].endswith("/health"):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"].endswith("/models"):
        payload = b'{"object":"list","data":[{"id":"policy","object":"model"}]}'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        return
    stream = b'"stream": true' in body or b'"stream":true' in body
    if stream:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": STREAM})
    else:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": NON_STREAM})


# --- conversations (`--conversation`) ---------------------------------------------------------

VOCAB = 49_152  # SmolLM2's vocabulary: the trainer embeds these ids
BOS, END = 1, 2
ROLE_IDS = {"system": 3, "developer": 3, "user": 4, "assistant": 5, "tool": 6}
OTHER_ROLE = 7
FIRST_WORD = 16
END_TOKEN = "<|im_end|>"
CONTEXT = 8192
_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "ti",
    "vo",
    "be",
    "da",
    "fu",
    "go",
    "hi",
    "ja",
    "pe",
    "qu",
    "ze",
    "xo",
    "wi",
    "yu",
]
# 2,000 words that answers and users are made of
WORDS = [a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in ("", "n", "s", "ter", "ly")]
_NEXT_STATE = re.compile(r"\[next state: \w+\] (.*)")


@functools.lru_cache(maxsize=1 << 18)
def word_id(word: str) -> int:
    return FIRST_WORD + zlib.crc32(word.encode()) % (VOCAB - FIRST_WORD)


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return json.dumps(content)


@functools.lru_cache(maxsize=1 << 17)
def _message_ids(role: str, text: str) -> tuple[int, ...]:
    return (ROLE_IDS.get(role, OTHER_ROLE), *(word_id(w) for w in text.split()), END)


def message_ids(message: dict[str, Any]) -> tuple[int, ...]:
    """A message as a chat template renders it: its role, a token a word, the end."""
    text = text_of(message.get("content"))
    if message.get("tool_calls"):
        text += " " + orjson.dumps(message["tool_calls"]).decode()
    return _message_ids(str(message.get("role")), text)


def prompt_ids(messages: list[dict[str, Any]], generation_prompt: bool = True) -> list[int]:
    ids = [BOS]
    for message in messages:
        ids.extend(message_ids(message))
    if generation_prompt:
        ids.append(ROLE_IDS["assistant"])
    return ids


def answer_of(messages: list[dict[str, Any]], max_tokens: int | None) -> tuple[list[str], str]:
    """The answer's tokens (the end token last when it stopped) and its finish reason: 24-64
    words drawn from a hash of the conversation, the same for the same conversation."""
    last = text_of(messages[-1].get("content")) if messages else ""
    seed = zlib.crc32(f"{len(messages)}:{last}".encode())
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(24 + seed % 41)]
    tokens = [words[0], *(" " + w for w in words[1:])]
    if max_tokens is not None and len(tokens) + 1 > max_tokens:
        return tokens[: max(1, max_tokens)], "length"
    return [*tokens, END_TOKEN], "stop"


def token_id(token: str) -> int:
    return END if token == END_TOKEN else word_id(token.strip())


def _entry(token: str, tid: int) -> dict[str, Any]:
    logprob = -0.05 - (tid % 23) / 10
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def _verdict(body: dict[str, Any]) -> str:
    """A PRM vote on the turn in the judge prompt, read from the user's next words."""
    transcript = text_of(body["messages"][-1].get("content"))
    following = " ".join(_NEXT_STATE.findall(transcript)).lower()
    if "thanks" in following or "thank you" in following:
        return "The user is satisfied. \\boxed{1}"
    if "wrong" in following:
        return "A correction. \\boxed{-1}"
    if zlib.crc32(following.encode()) % 2 == 0:
        return "The user moves on. \\boxed{1}"
    return "Unclear. \\boxed{0}"


def _stopped(text: str, stop: str | list[str] | None) -> tuple[str, str | None]:
    """vLLM's `stop`: the text ends before the first stop string it holds, named."""
    stops = [stop] if isinstance(stop, str) else stop or []
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return text, None
    at, met = min(found)
    return text[:at], met


JSON = [(b"content-type", b"application/json")]


class Conversations:
    """The ASGI app of `--conversation` (see the module's docstring)."""

    def __init__(self, engine_ms: float = 300.0, judge_ms: float = 100.0, name: str = "policy"):
        self.engine_s = engine_ms / 1000
        self.judge_s = judge_ms / 1000
        self.name = name
        self.version = 0  # of the base weights
        self.adapters: dict[str, int] = {}  # LoRA adapter name -> its weight version
        self.stats: Counter[str] = Counter()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        body = await read_body({}, receive, BODY_LIMIT)
        judge = path.startswith("/judge/")
        route = path.removeprefix("/judge")
        if route == "/health":
            await self._send(send, 200, b"")
        elif route == "/stats":
            stats = {**self.stats, "adapters_loaded": len(self.adapters)}
            await self._send(send, 200, orjson.dumps(stats), JSON)
        elif route.endswith("/models"):
            await self._send(send, 200, self._models(judge), JSON)
        elif route.endswith("/tokenize"):
            self.stats["tokenize"] += 1
            asked = orjson.loads(body)
            if asked.get("messages") is not None:
                tokens = prompt_ids(asked["messages"], asked.get("add_generation_prompt", True))
            else:
                tokens = [word_id(w) for w in str(asked.get("prompt", "")).split()]
            answer = {"count": len(tokens), "max_model_len": CONTEXT, "tokens": tokens}
            await self._send(send, 200, orjson.dumps(answer), JSON)
        elif route.endswith("/chat/completions"):
            if judge:
                await self._judge(send, orjson.loads(body))
            else:
                await self._chat(send, orjson.loads(body))
        elif route == "/v1/load_lora_adapter":
            await self._load_adapter(send, orjson.loads(body))
        elif route == "/v1/unload_lora_adapter":
            name = orjson.loads(body).get("lora_name")
            if self.adapters.pop(name, None) is None:
                await self._error(send, 404, f"The lora adapter '{name}' cannot be found.")
                return
            self.stats["adapter_unloads"] += 1
            await self._send(send, 200, f"Success: LoRA adapter '{name}' removed.".encode())
        elif route == "/admin/load_weights":
            await self._load_weights(send, orjson.loads(body))
        else:
            await self._error(send, 404, f"no route {path}")

    @staticmethod
    async def _send(
        send: Any, status: int, payload: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers or []})
        await send({"type": "http.response.body", "body": payload})

    async def _error(self, send: Any, status: int, message: str) -> None:
        self.stats[f"http_{status}"] += 1
        error = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
        await self._send(send, status, orjson.dumps(error), JSON)

    def _models(self, judge: bool) -> bytes:
        if judge:
            cards: list[dict[str, Any]] = [
                {"id": "judge", "object": "model", "max_model_len": CONTEXT}
            ]
        else:
            cards = [
                {
                    "id": self.name,
                    "object": "model",
                    "root": "stand-in",
                    "max_model_len": CONTEXT,
                    "weight_version": self.version,
                }
            ]
            cards += [
                {"id": n, "object": "model", "parent": self.name, "weight_version": v}
                for n, v in self.adapters.items()
            ]
        return orjson.dumps({"object": "list", "data": cards})

    async def _chat(self, send: Any, body: dict[str, Any]) -> None:
        model = str(body.get("model") or self.name)
        if model in self.adapters:
            version = self.adapters[model]
        elif adapter_version(model) is not None:  # an adapter it does not hold
            await self._error(send, 404, f"The model `{model}` does not exist.")
            return
        else:
            version = self.version
        self.stats["chat"] += 1
        self.stats["chat_adapter" if model in self.adapters else "chat_base"] += 1
        messages = body.get("messages") or []
        prompt = prompt_ids(messages)
        tokens, finish = answer_of(messages, body.get("max_tokens"))
        ids = [token_id(t) for t in tokens]
        content = "".join(t for t in tokens if t != END_TOKEN)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        await asyncio.sleep(self.engine_s)
        base = {"id": "chatcmpl-standin", "created": int(time.time()), "model": model}
        if body.get("stream"):
            chunk = {**base, "object": "chat.completion.chunk"}
            first = {
                **chunk,
                "prompt_token_ids": prompt,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            }
            lines = [first]
            for token, tid in zip(tokens, ids, strict=True):
                text = "" if token == END_TOKEN else token
                choice = {
                    "index": 0,
                    "delta": {"content": text},
                    "logprobs": {"content": [_entry(token, tid)]},
                    "token_ids": [tid],
                }
                lines.append({**chunk, "choices": [choice]})
            last = {"index": 0, "delta": {}, "finish_reason": finish, "token_ids": []}
            lines.append({**chunk, "choices": [last]})
            lines.append({**chunk, "choices": [], "usage": usage})
            payload = b"".join(b"data: " + orjson.dumps(x) + b"\n\n" for x in lines)
            headers = [(b"content-type", b"text/event-stream")]
            headers.append((VERSION_HEADER.lower().encode(), str(version).encode()))
            await self._send(send, 200, payload + b"data: [DONE]\n\n", headers)
            return
        answer = {
            **base,
            "object": "chat.completion",
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": {
                        "content": [_entry(t, i) for t, i in zip(tokens, ids, strict=True)]
                    },
                    "finish_reason": finish,
                    "token_ids": ids,
                }
            ],
            "usage": usage,
        }
        headers = [*JSON, (VERSION_HEADER.lower().encode(), str(version).encode())]
        await self._send(send, 200, orjson.dumps(answer), headers)

    async def _judge(self, send: Any, body: dict[str, Any]) -> None:
        n = int(body.get("n") or 1)
        self.stats["judge"] += 1
        self.stats["judge_votes"] += n
        text, met = _stopped(_verdict(body), body.get("stop"))
        await asyncio.sleep(self.judge_s)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "stop_reason": met,
            }
            for i in range(n)
        ]
        answer = {
            "id": "chatcmpl-judge",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "judge",
            "choices": choices,
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": 1 + n},
        }
        await self._send(send, 200, orjson.dumps(answer), JSON)

    async def _load_adapter(self, send: Any, body: dict[str, Any]) -> None:
        name, path = str(body.get("lora_name")), str(body.get("lora_path"))
        if name in self.adapters:
            await self._error(send, 400, f"The lora adapter '{name}' has already been loaded.")
            return
        if not (Path(path) / "adapter_config.json").is_file():
            await self._error(send, 404, f"No adapter found at {path}")
            return
        self.adapters[name] = adapter_version(name) or 0
        self.stats["adapter_loads"] += 1
        await self._send(send, 200, f"Success: LoRA adapter '{name}' added.".encode())

    async def _load_weights(self, send: Any, body: dict[str, Any]) -> None:
        folder = Path(str(body.get("path")))
        if not (folder.is_dir() and any(folder.glob("*.safetensors"))):
            await self._error(send, 404, f"no safetensors files in {folder}")
            return
        version = self.version + 1 if body.get("version") is None else int(body["version"])
        if version <= self.version and not body.get("rollback"):
            await self._error(send, 409, f"version {version} is not newer than {self.version}")
            return
        self.version = version
        self.stats["weight_loads"] += 1
        headers = [*JSON, (VERSION_HEADER.lower().encode(), str(version).encode())]
        answer = orjson.dumps({"weight_version": version, "seconds": 0.0})
        await self._send(send, 200, answer, headers)


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description="A stand-in for vLLM's OpenAI server.")
    parser.add_argument("port", type=int)
    parser.add_argument("--conversation", action="store_true", help="Answer conversations.")
    parser.add_argument("--engine-ms", type=float, default=300.0, help="An answer's time.")
    parser.add_argument("--judge-ms", type=float, default=100.0, help="A judge answer's time.")
    args = parser.parse_args()
    served = Conversations(args.engine_ms, args.judge_ms) if args.conversation else app
    uvicorn.run(served, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
