"""Settings section `eval:` (env CLAW_EVAL__<FIELD>): what `claw-stream eval` plays."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(
        default="arithmetic-heldout", description="A shipped dataset name or a JSONL file."
    )
    agent: Literal["tool-call", "terminal", "chat"] = "tool-call"
    limit: int | None = Field(default=None, ge=1, description="The first N tasks only.")
    attempts: int = Field(default=1, ge=1, description="Episodes per task.")
    temperature: float = Field(default=0.0, ge=0, description="0: greedy, comparable runs.")
    max_tokens: int = Field(default=128, ge=1)
    max_turns: int = Field(default=4, ge=1)
    concurrency: int = Field(default=4, ge=1)
    on_ready: bool = Field(
        default=False,
        description="`claw-stream up` runs `claw-stream eval --follow`: every version the "
        "trainer announces ready is evaluated once.",
    )
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(
        default=9402, ge=1, le=65535, description="Prometheus of `eval --follow`; None: off."
    )
