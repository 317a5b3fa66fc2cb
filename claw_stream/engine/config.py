"""The built-in engine's settings section (`engine:`, env CLAW_ENGINE__<FIELD>)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EngineSettings(BaseModel):
    """The built-in engine (`claw-stream engine`); env CLAW_ENGINE__<FIELD>."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address the engine listens on.")
    port: int = Field(default=8001, ge=1, le=65535, description="Port the engine listens on.")
    device: str = Field(
        default="cpu", description="The torch device the model runs on: cpu, cuda, cuda:1, ..."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="The precision the model's weights are loaded and run in."
    )
    max_batch: int = Field(
        default=32,
        ge=1,
        description="Requests generated at once; more wait for a free place. A model with "
        "sliding-window attention layers serves one at a time.",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="Longest sequence, prompt and answer, in tokens; a longer prompt is refused "
        "(400). None: the model's max_position_embeddings, else 2048.",
    )
    default_max_tokens: int = Field(default=1024, ge=1, description="When a request sets none.")
    served_model_name: str | None = Field(default=None, description="Defaults to the model name.")
    threads: int | None = Field(
        default=None, ge=1, description="torch threads; default: all cores."
    )
    open_lora_routes: bool = Field(
        default=False,
        description="Serve /v1/load_lora_adapter and /v1/unload_lora_adapter without the admin "
        "key, as vLLM does (compatibility tests only).",
    )
    max_loaded_adapters: int | None = Field(
        default=8,
        ge=1,
        description="LoRA adapters kept in the model at once (vLLM's --max-loras); past it the "
        "least recently used idle one leaves, and a request for it loads it again from its "
        "folder. None: no limit.",
    )
    prefix_cache_mb: float = Field(
        default=1024,
        ge=0,
        description="Memory for the KV states of prompt prefixes shared across requests "
        "(vLLM's automatic prefix caching); 0 turns it off. SmolLM2-135M in fp32 holds "
        "about 22k tokens in 1 GiB.",
    )
