"""Wire format of the built-in engine: the subset of vLLM's OpenAI-compatible protocol we use.

Field names and shapes follow vLLM (`vllm/entrypoints/openai/protocol.py`): `return_token_ids`
puts `prompt_token_ids` at the top of a chat response and `token_ids` in each choice;
`/v1/completions` takes text or token ids and answers `prompt_logprobs` as a list whose first
entry is null and whose others map token id -> {logprob, rank, decoded_token}. Two additions of
ours, both optional for clients: `weight_version` (the policy version that generated the
response) and `token_weight_versions` (per token, present when a weight swap spanned the call).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


MAX_CHOICES = 16  # `n`: choices sampled for one prompt (the prompt is prefilled once)


class OpenAIModel(BaseModel):
    # clients send fields we do not use (user, metadata, store, ...): accept and ignore them
    model_config = ConfigDict(extra="allow")


# --- requests ------------------------------------------------------------------------------------


class StreamOptions(OpenAIModel):
    include_usage: bool = True  # vLLM: sending stream_options at all turns usage on
    continuous_usage_stats: bool = False


class SamplingRequest(OpenAIModel):
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class ChatCompletionRequest(SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=0)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: variables for the template
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _checks(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        for i, message in enumerate(self.messages):
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                raise ValueError(
                    f"messages[{i}].role must be system, developer, user, assistant or tool"
                )
        return self


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] = Field(description="Text, or token ids (one prompt).")
    logprobs: int | None = Field(default=None, ge=0, le=20)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, prompt: str | list[int]) -> str | list[int]:
        if len(prompt) == 0:
            raise ValueError("prompt must not be empty")
        if isinstance(prompt, list) and any(t < 0 for t in prompt):
            raise ValueError("prompt token ids must be >= 0")
        return prompt


class TokenizeRequest(OpenAIModel):
    """vLLM's `/tokenize`: a chat (messages, rendered with the chat template) or a text prompt."""

    model: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of messages and prompt")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class LoadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(OpenAIModel):
    lora_name: str = Field(min_length=1)


class LoadWeightsRequest(OpenAIModel):
    path: str = Field(min_length=1, description="A safetensors folder (save_pretrained output).")
    version: int | None = Field(default=None, ge=0, description="Defaults to current + 1.")
    rollback: bool = Field(
        default=False,
        description="Load a version not newer than the served one (`claw-stream rollback`); "
        "without it an older version is refused (a stale trainer must not win).",
    )


# --- responses -----------------------------------------------------------------------------------


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatLogprob] | None = None


class ChatCompletionFunctionCall(BaseModel):
    name: str
    arguments: str


class ChatCompletionToolCall(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool"))
    type: Literal["function"] = "function"
    function: ChatCompletionFunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ChatCompletionToolCall] = Field(default_factory=list)


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class PromptTokenUsageInfo(BaseModel):
    cached_tokens: int | None = None


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


FinishReason = Literal["stop", "length", "tool_calls", "abort"]


class ChatCompletionResponseChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None
    weight_version: int
    token_weight_versions: list[int] | None = None


class ChatCompletionResponseStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
    weight_version: int | None = None
    token_weight_versions: list[int] | None = None


class Logprob(BaseModel):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo
    weight_version: int
    token_weight_versions: list[int] | None = None


# --- /classify (vLLM's classification API, for sequence-classification reward models) ----------


class ClassificationRequest(OpenAIModel):
    model: str | None = None
    input: str | list[str] = Field(description="One text or several, each classified alone.")

    @field_validator("input")
    @classmethod
    def _some(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("input must hold at least one text")
        return value


class ClassificationData(BaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("classify"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "claw-stream"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    weight_version: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
