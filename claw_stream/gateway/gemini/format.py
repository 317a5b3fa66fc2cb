"""The Gemini API in terms of chat completions: its contents as chat messages, a chat answer
(whole, or chunk by chunk) as a `GenerateContentResponse` and its stream.

Parts: `text` (a `thought` part is the model's reasoning), `functionCall` (a model's tool call:
`id`, `name`, `args`) and `functionResponse` (its result in the user's turn). Images and files
are left out: the policy reads text. A call without an `id` (older clients) gets one from its
place in the conversation, and its response the id of the first open call of its name, so the
same conversation always renders the same prompt.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from claw_stream.gateway.gemini.protocol import (
    Content,
    GenerateContentRequest,
    GenerationConfig,
    ThinkingConfig,
)
from claw_stream.gateway.protocol import DOOR_FIELD
from claw_stream.gateway.translate import arguments_object, chat_tool, door_note, session_fields

# chat's finish reasons as Gemini's; a tool call ends with STOP there
FINISH_REASONS = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "tool_calls": "STOP",
    "content_filter": "SAFETY",
}
# Gemini 3's thinking levels as the engine's reasoning effort (vLLM's names)
LEVELS = {"MINIMAL": None, "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}
# accepted, and recorded in the Step as not honoured: they steer Google's own service
NOT_HONOURED = ("safetySettings", "cachedContent", "labels")


def field(obj: dict[str, Any], camel: str) -> Any:
    """A field of a Gemini JSON object in either spelling (`functionCall`, `function_call`)."""
    if camel in obj:
        return obj[camel]
    return obj.get("".join(f"_{c.lower()}" if c.isupper() else c for c in camel))


# --- request -------------------------------------------------------------------------------


def _text(content: Content | str | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(p["text"]) for p in content.parts if isinstance(p.get("text"), str))


def chat_messages(req: GenerateContentRequest) -> list[dict[str, Any]]:
    """The system instruction and contents as chat messages: a user turn's `functionResponse`
    parts become tool messages (ahead of its text), a model turn's `functionCall` parts its
    tool calls and its `thought` parts its reasoning. ValueError names what cannot be read."""
    out: list[dict[str, Any]] = []
    if system := _text(req.system_instruction):
        out.append({"role": "system", "content": system})
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls not answered yet
    for i, content in enumerate(req.contents):
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, part in enumerate(content.parts):
            where = f"contents.{i}.parts.{j}"
            call, response = field(part, "functionCall"), field(part, "functionResponse")
            if isinstance(part.get("text"), str):
                (thoughts if part.get("thought") else texts).append(part["text"])
            elif call is not None:
                if content.role != "model":
                    raise ValueError(f"{where}: a functionCall in a user turn")
                if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                    raise ValueError(f"{where}.functionCall needs a name")
                if not isinstance(call.get("args") or {}, dict):
                    raise ValueError(f"{where}.functionCall.args must be an object")
                call_id = str(call.get("id") or f"call_{i}_{j}")
                open_calls.append((call_id, call["name"]))
                arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call["name"], "arguments": arguments},
                    }
                )
            elif response is not None:
                if content.role == "model":
                    raise ValueError(f"{where}: a functionResponse in a model turn")
                if not isinstance(response, dict) or not isinstance(response.get("name"), str):
                    raise ValueError(f"{where}.functionResponse needs a name")
                if not isinstance(response.get("response") or {}, dict):
                    raise ValueError(f"{where}.functionResponse.response must be an object")
                results.append(_tool_message(response, open_calls, f"call_{i}_{j}"))
            # inlineData, fileData, executableCode, ...: the policy reads text
        if content.role == "model":
            reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                reply["tool_calls"] = calls
            if thoughts:
                reply["reasoning_content"] = "".join(thoughts)
            out.append(reply)
        else:
            out.extend(results)
            if texts or not results:
                out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_message(
    response: dict[str, Any], open_calls: list[tuple[str, str]], fallback: str
) -> dict[str, Any]:
    """A functionResponse as a tool message, tied to its call by id, else by name."""
    call_id = response.get("id")
    key = 0 if call_id else 1  # its call by id, else by name
    wanted = call_id or response["name"]
    match = next((k for k, call in enumerate(open_calls) if call[key] == wanted), None)
    if match is not None:
        call_id = open_calls.pop(match)[0]
    result = response.get("response")
    if isinstance(result, dict) and set(result) <= {"output", "error"} and len(result) == 1:
        # Gemini CLI's `{"output": text}` (or `{"error": text}`): the text, as chat clients send
        ((kind, value),) = result.items()
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        result_text = f"Error: {text}" if kind == "error" else text
    else:
        result_text = json.dumps(result, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": str(call_id or fallback), "content": result_text}


def json_schema(schema: Any) -> Any:
    """A Gemini `Schema` (OpenAPI's subset, types in capitals) as JSON Schema."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: json_schema(s) for name, s in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "not", "additionalProperties"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Function declarations as chat tools, and the tools left out (Google Search, code
    execution, URL context: tools Google runs itself, which no engine here runs)."""
    out, left_out = [], []
    for i, tool in enumerate(tools or ()):
        declarations = field(tool, "functionDeclarations")
        for kind in tool:
            if kind not in ("functionDeclarations", "function_declarations"):
                left_out.append(kind)
        if declarations is None:
            continue
        if not isinstance(declarations, list):
            raise ValueError(f"tools.{i}.functionDeclarations must be a list")
        for j, fn in enumerate(declarations):
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"tools.{i}.functionDeclarations.{j} needs a name")
            schema = field(fn, "parametersJsonSchema")
            if schema is None and fn.get("parameters") is not None:
                schema = json_schema(fn["parameters"])
            if schema is not None and not isinstance(schema, dict):
                raise ValueError(f"tools.{i}.functionDeclarations.{j}: parameters must be a schema")
            out.append(chat_tool(fn["name"], fn.get("description"), schema))
    return out, left_out


MODES = {"AUTO": "auto", "VALIDATED": "auto", "NONE": "none", "ANY": "required"}


def chat_tool_choice(tool_config: dict[str, Any] | None) -> str | dict[str, Any] | None:
    """`toolConfig.functionCallingConfig` as chat's tool choice (ANY with one allowed name:
    that function)."""
    calling = field(tool_config or {}, "functionCallingConfig") or {}
    mode = calling.get("mode")
    if mode in (None, "MODE_UNSPECIFIED"):
        return None
    if mode not in MODES:
        raise ValueError(f"toolConfig.functionCallingConfig.mode must be one of {', '.join(MODES)}")
    allowed = field(calling, "allowedFunctionNames") or []
    if mode == "ANY" and len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}
    return MODES[mode]


def reasoning_settings(thinking: ThinkingConfig | None) -> dict[str, Any]:
    """`thinkingConfig` as the engine's reasoning settings, by vLLM's names (see
    `messages.format.reasoning_settings`): a budget of 0 or the MINIMAL level switches the
    template's thinking off, any other on; a level is also the reasoning effort.
    `includeThoughts` alone changes no prompt: it says whether thoughts come back."""
    if thinking is None:
        return {}
    settings: dict[str, Any] = {}
    if thinking.thinking_budget is not None:
        settings["chat_template_kwargs"] = {"enable_thinking": thinking.thinking_budget != 0}
    if thinking.thinking_level is not None:
        level = thinking.thinking_level.upper()
        if level == "THINKING_LEVEL_UNSPECIFIED":
            return settings
        if level not in LEVELS:
            raise ValueError(
                f"generationConfig.thinkingConfig.thinkingLevel must be one of {', '.join(LEVELS)}"
            )
        settings["chat_template_kwargs"] = {"enable_thinking": LEVELS[level] is not None}
        if LEVELS[level] is not None:
            settings["reasoning_effort"] = LEVELS[level]
    return settings


def _sampling(config: GenerationConfig) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("max_output_tokens", "max_tokens"),
        ("stop_sequences", "stop"),
        ("presence_penalty", "presence_penalty"),
        ("frequency_penalty", "frequency_penalty"),
        ("seed", "seed"),
    ):
        value = getattr(config, ours)
        if value is not None:
            chat[theirs] = value
    if config.response_mime_type == "application/json":
        schema = config.response_json_schema or json_schema(config.response_schema)
        chat["response_format"] = (
            {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
            if schema
            else {"type": "json_object"}
        )
    return chat


def chat_body(
    req: GenerateContentRequest, body: dict[str, Any], model: str, stream: bool
) -> dict[str, Any]:
    chat: dict[str, Any] = {"model": model, "messages": chat_messages(req), "stream": stream}
    if stream:
        chat["stream_options"] = {"include_usage": True}
    tools, left_out = chat_tools(req.tools)
    choice = chat_tool_choice(req.tool_config)  # checked with or without tools
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    config = req.generation_config or GenerationConfig()
    chat.update(_sampling(config))
    chat.update(reasoning_settings(config.thinking_config))
    chat[DOOR_FIELD] = door_note(
        "gemini", [k for k in NOT_HONOURED if field(body, k) is not None], left_out
    )
    return chat | session_fields(body)


def includes_thoughts(req: GenerateContentRequest) -> bool:
    thinking = req.generation_config.thinking_config if req.generation_config else None
    return bool(thinking and thinking.include_thoughts)


# --- response ------------------------------------------------------------------------------


def call_part(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "functionCall": {
            "id": str(call.get("id") or ""),
            "name": str(fn.get("name", "")),
            "args": arguments_object(fn.get("arguments")),
        }
    }


def parts_of(message: dict[str, Any], thoughts: bool) -> list[dict[str, Any]]:
    """A chat answer's message as Gemini parts: its reasoning (as a `thought` part, when the
    client asked for thoughts), its text, its tool calls."""
    parts: list[dict[str, Any]] = []
    if thoughts and message.get("reasoning_content"):
        parts.append({"text": message["reasoning_content"], "thought": True})
    if message.get("content"):
        parts.append({"text": message["content"]})
    parts.extend(call_part(call) for call in message.get("tool_calls") or ())
    return parts or [{"text": ""}]


def usage_metadata(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Chat usage as Gemini's: thoughts counted apart from the answer's own tokens."""
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    thoughts = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    out: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion - thoughts,
        "totalTokenCount": prompt + completion,
    }
    if thoughts:
        out["thoughtsTokenCount"] = thoughts
    if cached:
        out["cachedContentTokenCount"] = cached
    return out


def response_object(
    response_id: str,
    model: str,
    parts: list[dict[str, Any]],
    finish: str | None,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A `GenerateContentResponse` of one candidate (a stream's chunk without finish or
    usage)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate]}
    if usage is not None:
        out["usageMetadata"] = usage
    out["modelVersion"] = model
    out["responseId"] = response_id
    return out


def finish_reason(choice: dict[str, Any]) -> str:
    return FINISH_REASONS.get(choice.get("finish_reason") or "stop", "OTHER")


# --- stream --------------------------------------------------------------------------------


class GeminiStream:
    """Chat chunks in, `GenerateContentResponse` chunks out: text and thoughts as they come,
    then one last chunk with the tool calls (Gemini sends a call whole), the finish reason
    and the usage."""

    def __init__(self, response_id: str, model: str, thoughts: bool, sse: bool):
        self.response_id = response_id
        self.model = model
        self.thoughts = thoughts
        self.sse = sse  # `alt=sse`: server-sent events; else one JSON array, streamed
        self.sent = 0  # chunks written
        self.calls: dict[int, dict[str, Any]] = {}  # by chat index: id, name, arguments
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def frame(self, payload: dict[str, Any]) -> bytes:
        data = orjson.dumps(payload)
        self.sent += 1
        if self.sse:
            return b"data: " + data + b"\r\n\r\n"
        return (b"[" if self.sent == 1 else b",\r\n") + data

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        parts: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if self.thoughts and delta.get("reasoning_content"):
                parts.append({"text": delta["reasoning_content"], "thought": True})
            if delta.get("content"):
                parts.append({"text": delta["content"]})
            for call in delta.get("tool_calls") or ():
                held = self.calls.setdefault(
                    call.get("index", 0), {"id": "", "name": "", "arguments": ""}
                )
                fn = call.get("function") or {}
                held["id"] = held["id"] or str(call.get("id") or "")
                held["name"] += fn.get("name") or ""
                held["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish = finish_reason(choice)
        if not parts:
            return b""
        return self.frame(response_object(self.response_id, self.model, parts, None, None))

    def end(self) -> bytes:
        assert self.finish is not None
        parts = [
            call_part({"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}})
            for _, c in sorted(self.calls.items())
        ]
        last = response_object(
            self.response_id,
            self.model,
            parts or [{"text": ""}],
            self.finish,
            usage_metadata(self.usage),
        )
        return self.frame(last) + (b"" if self.sse else b"]")

    def error(self, status: int, message: str, kind: str) -> bytes:
        """An error after the stream began: Google's error object, as its next chunk."""
        error = {"error": {"code": status, "message": message, "status": kind}}
        return self.frame(error) + (b"" if self.sse else b"]")
