"""From a client's request and the engine's answer to a `Step`, with exactly the sampled tokens.

The gateway asks the engine for `return_token_ids` and `logprobs` whatever the client asked;
`strip_*` removes what the client did not ask for before it sees the answer. Tokens are never
re-derived from text.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError

from claw_stream.dialect import flatten_content
from claw_stream.events import SCHEMA_VERSION, Step, StepRequest
from claw_stream.gateway.protocol import DOOR_FIELD
from claw_stream.gateway.redaction import Hits, Redactor
from claw_stream.names import adapter_version
from claw_stream.skills.text import SKILLS_FIELD, with_block

_KNOWN = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
}


@dataclass
class ClientAsked:
    """What the client asked for itself; the rest is stripped from what it receives."""

    token_ids: bool
    logprobs: bool
    usage: bool
    completion_id: str | None = None  # the answer's `id`: it names the call's Step
    model: str | None = None  # the model name it asked for, when the engine served another


# A completion's `id` carries its Step's id, so a client can name the completion it rewards
# (AReaL's `interaction_id`) and the gateway finds the Step without a lookup.
INTERACTION_PREFIXES = ("chatcmpl-", "resp_", "msg_")


def completion_id(step_id: uuid.UUID, prefix: str = "chatcmpl-") -> str:
    return prefix + step_id.hex


def step_id_of(interaction_id: str) -> uuid.UUID | None:
    """The Step a completion's `id` names; None when it names none."""
    for prefix in INTERACTION_PREFIXES:
        if interaction_id.startswith(prefix):
            with contextlib.suppress(ValueError):
                step_id = uuid.UUID(hex=interaction_id[len(prefix) :])
                return step_id if step_id.version == 7 else None
    return None


def prepare_upstream(
    body: dict[str, Any],
    completion_id: str | None = None,
    served_model: str | None = None,
    hosted: bool = False,
) -> tuple[dict[str, Any], ClientAsked]:
    """The body sent to the engine: the client's, plus token ids, logprobs and stream usage,
    naming `served_model` (when given) instead of the client's model. A `hosted` API is asked
    the client's request with stream usage only: it knows no token ids."""
    asked_model = body.get("model")
    renamed = served_model is not None and served_model != asked_model
    asked = ClientAsked(
        token_ids=bool(body.get("return_token_ids")),
        logprobs=bool(body.get("logprobs")),
        usage=bool((body.get("stream_options") or {}).get("include_usage")),
        completion_id=completion_id,
        model=asked_model if renamed else None,
    )
    upstream = dict(body)
    upstream.pop(DOOR_FIELD, None)  # for the Step only
    skills = upstream.pop(SKILLS_FIELD, None)  # the Step notes them, the engine reads them
    if skills:
        upstream["messages"] = with_block(body["messages"], skills["block"], skills["position"])
    if renamed:
        upstream["model"] = served_model
    if not hosted:
        upstream["return_token_ids"] = True
        upstream["logprobs"] = True
    if body.get("stream"):
        upstream["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return upstream, asked


# Where the prompt's token ids start, in the compact form vLLM and the built-in engine write.
# The quotes around the key cannot occur unescaped inside a JSON string.
_PROMPT_IDS = b'"prompt_token_ids":['
_ID_CHARS = b"0123456789,"


class RawIds:
    """A JSON array of token ids kept as the engine's bytes, never turned into Python ints.

    A prompt's ids are most of an answer (2,048 ids are 10 KB): parsing, re-encoding and
    freeing them was an eighth of the gateway's CPU per call. The bytes hold only digits and
    commas in a well-formed order, so they are a JSON array of non-negative integers.
    """

    __slots__ = ("json",)

    def __init__(self, data: bytes):
        self.json = data

    @classmethod
    def checked(cls, data: bytes) -> RawIds | None:
        inner = data[1:-1]
        if (
            not inner
            or inner.translate(None, _ID_CHARS)  # anything but digits and commas
            or inner[:1] == b","
            or inner[-1:] == b","
            or b",," in inner
        ):
            return None
        return cls(data)

    def __bool__(self) -> bool:
        return True  # never empty (and `len` would count the commas)

    def __len__(self) -> int:
        return self.json.count(b",") + 1

    def first(self) -> int:
        end = self.json.find(b",")
        return int(self.json[1 : end if end > 0 else -1])


def encode_json(value: Any, *, anything_as_text: bool = False) -> bytes:
    """orjson, with `RawIds` written out as they came; with `anything_as_text`, any other
    value orjson cannot encode becomes its `str` (for dead letters) instead of an error."""
    return orjson.dumps(value, default=_as_text if anything_as_text else _fragment)


def _fragment(value: Any) -> orjson.Fragment:
    if isinstance(value, RawIds):
        return orjson.Fragment(value.json)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _as_text(value: Any) -> orjson.Fragment | str:
    return orjson.Fragment(value.json) if isinstance(value, RawIds) else str(value)


def parse_answer(content: bytes) -> Any:
    """The engine's JSON answer (or an array of stream chunks), its prompt token ids as
    `RawIds` where they can be.

    The ids are cut out of the bytes before parsing and put back where the parsed answer
    shows the cut (top level, or the first choice, of the first answer that has them);
    anything unexpected is parsed whole.
    """
    key = content.find(_PROMPT_IDS)
    if key < 0:
        return orjson.loads(content)
    start = key + len(_PROMPT_IDS) - 1  # at the array's "["
    end = content.find(b"]", start) + 1
    ids = RawIds.checked(content[start:end]) if end > 0 else None
    if ids is None:
        return orjson.loads(content)
    parsed = orjson.loads(content[:start] + b"[]" + content[end:])
    for answer in parsed if isinstance(parsed, list) else (parsed,):
        if not isinstance(answer, dict):
            continue
        choices = answer.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        for holder in (answer, first):
            if isinstance(holder, dict) and holder.get("prompt_token_ids") == []:
                holder["prompt_token_ids"] = ids
                return parsed
    return orjson.loads(content)


def strip_response(payload: dict[str, Any], asked: ClientAsked) -> None:
    """Remove from a response (or a stream chunk) the capture fields the client did not ask for,
    and give it the completion id that names its Step."""
    if asked.completion_id is not None:
        payload["id"] = asked.completion_id
    if asked.model is not None:
        payload["model"] = asked.model
    if not asked.token_ids:
        payload.pop("prompt_token_ids", None)
    for choice in payload.get("choices") or ():
        if not asked.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not asked.logprobs and "logprobs" in choice:
            choice["logprobs"] = None


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    """A ChatMessage of the contract, as a dict: content flattened, tool-call arguments as text."""
    calls = None
    if raw.get("tool_calls"):
        calls = []
        for i, call in enumerate(raw["tool_calls"]):
            fn = call.get("function") or {}
            calls.append(
                {
                    "id": str(call.get("id") or f"call_{i}"),
                    "type": "function",
                    "function": {
                        "name": str(fn.get("name", "")),
                        "arguments": _arguments(fn.get("arguments")),
                    },
                }
            )
    content = raw.get("content")
    return {
        "role": raw.get("role"),
        "content": None if content is None else flatten_content(content),
        "name": raw.get("name"),
        "tool_calls": calls,
        "tool_call_id": raw.get("tool_call_id"),
        "reasoning_content": raw.get("reasoning_content"),
    }


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {})


def step_request(body: dict[str, Any]) -> dict[str, Any]:
    stop = body.get("stop")
    return {
        "model": str(body.get("model")),
        "messages": [_message(m) for m in body["messages"]],
        "tools": body.get("tools"),
        "tool_choice": body.get("tool_choice"),
        "sampling": {
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
            "stop": [stop] if isinstance(stop, str) else stop,
            "seed": body.get("seed"),
            "n": body.get("n") or 1,
        },
        "stream": bool(body.get("stream")),
        "extra": {k: v for k, v in body.items() if k not in _KNOWN},
    }


def weight_version(payload: dict[str, Any], header: str | None, model: str | None) -> int:
    if isinstance(payload.get("weight_version"), int):
        return payload["weight_version"]
    if header and header.isdigit():
        return int(header)
    return adapter_version(model) or 0


@dataclass
class StepContext:
    step_id: uuid.UUID
    session_id: str
    group_id: str | None
    turn_type: str
    turn_index: int
    body: dict[str, Any]  # the client's body, session fields removed
    engine: str = ""
    served_model: str | None = None  # the engine's name for the model, when not the client's
    tenant: str | None = None  # whose agent the call serves (tenants.py)
    request: CheckedRequest | None = None  # prepared while the engine works, when it could be
    counted: bool = False  # its turn index is counted in the session store
    train: bool = True  # False: the Step is archived, never judged or trained
    redactor: Redactor | None = None  # None: nothing is redacted
    settled: bool = False  # its Step went to the publisher, or its turn index was given back


@dataclass
class CheckedRequest:
    """The request half of a Step, as encoded and as validated by the contract."""

    payload: dict[str, Any]
    model: StepRequest | None
    error: Exception | None = None
    redacted: Hits = ()  # what was redacted from the prompt's messages


def check_request(body: dict[str, Any], redactor: Redactor | None = None) -> CheckedRequest:
    """Flatten, redact and validate the request half of the Step; a problem is kept for
    `build_step`."""
    try:
        payload = step_request(body)
        redacted: Hits = ()
        if redactor is not None:
            redacted = redactor.messages(payload["messages"])
            if payload["extra"]:  # not in the prompt: redacted, not masked
                payload["extra"], _ = redactor.strings(payload["extra"])
        return CheckedRequest(payload, StepRequest.model_validate(payload), redacted=redacted)
    except (ValidationError, ValueError, TypeError, KeyError) as exc:
        return CheckedRequest({}, None, exc)


class StreamCapture:
    """Relays a stream's chunks to the client and assembles the engine's answer on the side.

    `feed` takes the bytes of the response as they arrive and returns what the client gets
    now, each chunk stripped of what it did not ask for. The answer's end (the finish reason,
    the usage) and anything after it is kept in `held` until the Step is recorded. A block of
    chunks is parsed by one `orjson` call and its prompt ids are kept as `RawIds`: when the
    engine is faster than the network, a whole answer arrives in one block.
    """

    def __init__(self, asked: ClientAsked):
        self.asked = asked
        self.held: list[bytes] = []
        self.done = False  # the engine's [DONE] arrived
        self.broken: ValueError | None = None  # the first chunk that could not be read
        self._ending = False
        self._rest = b""
        self.prompt_token_ids: list[int] | RawIds = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.weight_version: int | None = None
        self.model: str | None = None

    def feed(self, block: bytes) -> bytes:
        lines = (self._rest + block).split(b"\n")
        self._rest = lines.pop()  # the start of a line whose end is still on its way
        return self._relay(lines)

    def close(self) -> bytes:
        """What the client gets of a last line that had no newline."""
        rest, self._rest = self._rest, b""
        return self._relay([rest]) if rest else b""

    def _relay(self, lines: list[bytes]) -> bytes:
        if self.done:
            return b""
        payloads = [d[5:].strip() for d in map(bytes.strip, lines) if d[:5] == b"data:"]
        if b"[DONE]" in payloads:
            self.done = True
            del payloads[payloads.index(b"[DONE]") :]
        now: list[bytes] = []
        for data, chunk in zip(payloads, _parse_chunks(payloads), strict=True):
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                now.append(b"data: " + data + b"\n\n")
                continue
            try:
                keep = self._take(chunk)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                self.broken = self.broken or ValueError(f"unreadable stream chunk: {exc!r}")
                now.append(b"data: " + data + b"\n\n")
                continue
            if keep:
                strip_response(chunk, self.asked)
                # once the answer's end is held back, what follows it waits too
                (self.held if self._ending else now).append(
                    b"data: " + orjson.dumps(chunk, default=_fragment) + b"\n\n"
                )
        return b"".join(now)

    def _take(self, chunk: dict[str, Any]) -> bool:
        """Add a chunk to the answer; False when the client gets nothing of it."""
        if "prompt_token_ids" in chunk:
            self.prompt_token_ids = chunk["prompt_token_ids"] or self.prompt_token_ids
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        if "weight_version" in chunk and self.weight_version is None:
            version = chunk["weight_version"]
            self.weight_version = version if isinstance(version, int) else None
        if self.model is None:
            self.model = chunk.get("model")
        choices = chunk.get("choices")
        if not choices:
            if usage is not None:  # the usage chunk, after the last choice
                self._ending = True
                return self.asked.usage
            return True
        for choice in choices:
            if "token_ids" in choice:
                self.token_ids.extend(choice["token_ids"] or ())
            if "prompt_token_ids" in choice:
                self.prompt_token_ids = choice["prompt_token_ids"] or self.prompt_token_ids
            logprobs = choice.get("logprobs")
            if logprobs is not None:
                for entry in logprobs.get("content") or ():
                    self.logprobs.append(float(entry["logprob"]))
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                if content:
                    self.content.append(content)
                if delta.get("reasoning_content"):
                    self.reasoning.append(delta["reasoning_content"])
                if "tool_calls" in delta:
                    for call in delta["tool_calls"] or ():
                        self._add_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self._ending = True
        return True

    def _add_call(self, call: dict[str, Any]) -> None:
        slot = self.tool_calls.setdefault(
            call.get("index", 0), {"id": None, "name": "", "arguments": ""}
        )
        slot["id"] = call.get("id") or slot["id"]
        fn = call.get("function") or {}
        slot["name"] += fn.get("name") or ""
        slot["arguments"] += fn.get("arguments") or ""

    def as_response(self) -> dict[str, Any]:
        """The same shape as a non-streamed response, for `build_step`."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for _, c in sorted(self.tool_calls.items())
            ]
        return {
            "model": self.model,
            "prompt_token_ids": self.prompt_token_ids,
            "choices": [
                {
                    "message": message,
                    "finish_reason": self.finish_reason,
                    "token_ids": self.token_ids,
                    "logprobs": {"content": [{"logprob": lp} for lp in self.logprobs]},
                }
            ],
            "usage": self.usage,
            "weight_version": self.weight_version,
        }


def _parse_chunks(payloads: list[bytes]) -> list[Any]:
    """The chunks of a block, parsed as one JSON array when they can be (one call for the
    whole block); a chunk that is not JSON is None."""
    if len(payloads) > 1:
        with contextlib.suppress(orjson.JSONDecodeError):
            chunks = parse_answer(b"[" + b",".join(payloads) + b"]")
            if len(chunks) == len(payloads):
                return chunks
    parsed: list[Any] = []
    for data in payloads:
        try:
            parsed.append(parse_answer(data))
        except orjson.JSONDecodeError:
            parsed.append(None)
    return parsed


def _token_ids(values: Any, name: str) -> list[int]:
    """Token ids as the engine sent them: a list of integers, checked at C speed.

    A float or a string among them changes the sum's type or makes it fail; negative ids are
    left to the consumers' strict decoding (a per-element check would cost more than the
    rest of the Step).
    """
    if not isinstance(values, list):
        raise ValueError(f"{name} must be a list of token ids")
    try:
        integers = type(sum(values)) is int
    except TypeError:
        integers = False
    if not integers:
        raise ValueError(f"{name} must be integers")
    return values


def _logprobs(choice: dict[str, Any]) -> list[float]:
    values = [float(e["logprob"]) for e in ((choice.get("logprobs") or {}).get("content") or ())]
    try:
        finite = math.isfinite(math.fsum(values))
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError("response logprobs must be finite numbers")
    return [lp if lp <= 0.0 else 0.0 for lp in values]


def _usage(usage: dict[str, Any], prompt_ids: Any, token_ids: list[int]) -> dict[str, int]:
    """The engine's token counts; missing ones are counted (only then: `RawIds` count commas)."""
    prompt = int(usage["prompt_tokens"]) if "prompt_tokens" in usage else len(prompt_ids)
    completion = int(usage["completion_tokens"]) if "completion_tokens" in usage else len(token_ids)
    total = int(usage["total_tokens"]) if "total_tokens" in usage else prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def build_step(
    ctx: StepContext, response: dict[str, Any], version: int, latency_ms: float
) -> tuple[uuid.UUID, bytes]:
    """The Step of one call as its record value, checked against the contract.

    The event's structure is validated by the `Step` model itself; its token lists, nearly
    all of a Step's bytes, are checked in C instead of element by element (which would cost
    more than the rest of the gateway's work on a call), then the dict is encoded by orjson.
    """
    request = ctx.request or check_request(ctx.body, ctx.redactor)
    if request.error is not None:
        raise request.error
    # a secret redacted from the prompt's text is still in its token ids: masked, the Step
    # carries none and is not trained
    masked = bool(request.redacted) and ctx.redactor is not None and ctx.redactor.mask_prompts
    choice = (response.get("choices") or [{}])[0]
    token_ids = _token_ids(choice.get("token_ids") or [], "choices[0].token_ids")
    # a hosted API's answer has no token ids: its Step has none, and no log-probs either
    logprobs = _logprobs(choice) if token_ids else []
    prompt = response.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
    if isinstance(prompt, RawIds):
        prompt_ids: list[int] | RawIds = prompt
        prompt_head = [prompt.first()]
    else:
        prompt_ids = _token_ids(prompt, "prompt_token_ids")
        prompt_head = prompt_ids[:1]
    usage = _usage(response.get("usage") or {}, prompt_ids, token_ids)
    if masked:
        prompt_ids, prompt_head = [], []
    message = _message(dict(choice.get("message") or {}) | {"role": "assistant"})
    if ctx.redactor is not None:  # the model's answer: its text redacted, its tokens exact
        ctx.redactor.message(message)
    step: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created_at": datetime.now(UTC),
        "step_id": ctx.step_id,
        "session_id": ctx.session_id,
        "group_id": ctx.group_id,
        "turn_type": ctx.turn_type,
        "turn_index": ctx.turn_index,
        "request": request.payload,
        "response": {"message": message, "finish_reason": choice.get("finish_reason")},
        "prompt_token_ids": prompt_ids,
        "response_token_ids": token_ids,
        "response_logprobs": logprobs,
        "weight_version": version,
        "train": ctx.train and not masked,
        "response_weight_versions": None,
        "engine": ctx.engine,
        "served_model": ctx.served_model,
        "tenant": ctx.tenant,
        "latency_ms": latency_ms,
        "usage": usage,
    }
    if len(logprobs) != len(token_ids):
        raise ValueError(
            f"response_logprobs has {len(logprobs)} entries for {len(token_ids)} "
            "response_token_ids (one per sampled token)"
        )
    # the model sees the token lists cut to their first entry; they were checked above
    Step.model_validate(
        step
        | {
            "request": request.model,  # validated already: a model instance is taken as it is
            "prompt_token_ids": prompt_head,
            "response_token_ids": token_ids[:1],
            "response_logprobs": logprobs[:1],
        }
    )
    return ctx.step_id, encode_json(step)
