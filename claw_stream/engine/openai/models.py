"""Which model a request names, and what the engine serves: `/v1/models` and `/tokenize`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from claw_stream.dialect import OpenAIError
from claw_stream.engine.openai import protocol as p
from claw_stream.engine.openai.generation import render_chat


class ModelsCore(Protocol):
    """What `ModelsHandler` reads of the engine core (`EngineCore` has all of it)."""

    @property
    def adapters(self) -> dict[str, int]: ...  # LoRA adapter name -> weight version

    version: int  # of the base weights
    max_model_len: int
    model_path: Path
    tokenizer: Any

    def latest_policy_adapter(self, policy: str) -> str | None: ...


class ModelsHandler:
    def __init__(
        self,
        core: ModelsCore,
        served_model_name: str,
        default_max_tokens: int,
        policy_name: str = "policy",
    ):
        self.core = core
        self.served_model_name = served_model_name
        self.default_max_tokens = default_max_tokens
        self.policy_name = policy_name

    def resolve(self, model: str | None) -> str | None:
        """The adapter to use; the served name means the newest trained version of the policy
        (never a tenant's adapter, `alice@vN`: those are asked for by their whole name)."""
        core = self.core
        if model in (None, "", self.served_model_name, str(core.model_path)):
            return core.latest_policy_adapter(self.policy_name)
        if model in core.adapters:
            return model
        raise OpenAIError(404, f"The model `{model}` does not exist.", param="model")

    def check_length(self, n_prompt: int, max_tokens: int | None) -> int:
        """The tokens to generate: `max_tokens`, or what fits (up to the default) when unset."""
        limit = self.core.max_model_len
        if n_prompt >= limit:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{n_prompt} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        if max_tokens is None:
            return min(limit - n_prompt, self.default_max_tokens)
        if n_prompt + max_tokens > limit:
            raise OpenAIError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {limit} tokens and your request has {n_prompt} input "
                f"tokens ({max_tokens} > {limit} - {n_prompt}).",
                param="max_tokens",
            )
        return max_tokens

    def show_available_models(self) -> p.ModelList:
        """The served model, then each loaded adapter as its child."""
        core = self.core
        cards = [
            p.ModelCard(
                id=self.served_model_name,
                root=str(core.model_path),
                max_model_len=core.max_model_len,
                weight_version=core.version,
            )
        ]
        for name, version in core.adapters.items():
            cards.append(
                p.ModelCard(id=name, parent=self.served_model_name, weight_version=version)
            )
        return p.ModelList(data=cards)

    def tokenize(self, body: p.TokenizeRequest) -> p.TokenizeResponse:
        self.resolve(body.model)
        tokenizer = self.core.tokenizer
        if body.messages is not None:
            tokens = render_chat(
                tokenizer,
                body.messages,
                body.tools,
                None,
                body.chat_template_kwargs,
                body.add_generation_prompt,
            )
        else:
            encoded = tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)
            tokens = [int(i) for i in encoded["input_ids"]]
        return p.TokenizeResponse(
            count=len(tokens), max_model_len=self.core.max_model_len, tokens=tokens
        )
