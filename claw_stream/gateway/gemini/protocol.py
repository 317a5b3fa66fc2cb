"""What the gateway checks of a Gemini API request before translating it to chat.

The Gemini API reads its JSON in either spelling (`systemInstruction` or `system_instruction`,
as protobuf's JSON mapping does): so do these models. Other fields are accepted and ignored
(`safetySettings`, `cachedContent`, `labels`); the model is in the path, not the body.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# `{base}/v1beta/models/{model}:{method}`: Google's SDKs append it to their base URL
GEMINI_PATH = re.compile(
    r"(?P<base>.*?)/(?:v1|v1beta|v1alpha)/models/(?P<model>[^:]+):(?P<method>\w+)"
)


def model_and_method(path: str) -> tuple[str, str] | None:
    """The model and method a Gemini path names (`/v1beta/models/m:generateContent`: m,
    generateContent); None for any other path."""
    match = GEMINI_PATH.fullmatch(path)
    return None if match is None else (match["model"], match["method"])


class _Gemini(BaseModel):
    """A Gemini JSON object: lowerCamel names, snake_case ones taken too."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)


class Content(_Gemini):
    role: Literal["user", "model"] | None = None  # none: the user's
    parts: list[dict[str, Any]] = Field(default_factory=list)


class ThinkingConfig(_Gemini):
    include_thoughts: bool | None = None
    thinking_budget: int | None = Field(default=None, ge=-1)  # 0: off, -1: the model decides
    thinking_level: str | None = None  # MINIMAL, LOW, MEDIUM, HIGH (Gemini 3)


class GenerationConfig(_Gemini):
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    candidate_count: int | None = Field(default=None, ge=1, le=1)  # one Step per call
    max_output_tokens: int | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    response_mime_type: str | None = None
    response_schema: dict[str, Any] | None = None
    response_json_schema: dict[str, Any] | None = None
    thinking_config: ThinkingConfig | None = None


class GenerateContentRequest(_Gemini):
    """A `models/{model}:generateContent` (or `:streamGenerateContent`) request body."""

    contents: list[Content] = Field(min_length=1)
    system_instruction: Content | str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_config: dict[str, Any] | None = None
    generation_config: GenerationConfig | None = None
    # the gateway's own body extension, as on every door (`protocol.SESSION_FIELDS`)
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    turn_type: Literal["main", "side"] | None = None
    session_done: bool | None = None
    train: bool | None = None  # false: this call is archived, never trained


class GeminiCountTokensRequest(_Gemini):
    """`models/{model}:countTokens`: `contents`, or a whole `generateContentRequest`."""

    contents: list[Content] | None = None
    generate_content_request: GenerateContentRequest | None = None


class GeminiCountTokensResponse(_Gemini):
    total_tokens: int
