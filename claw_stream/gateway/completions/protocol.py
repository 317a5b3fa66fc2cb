"""What the gateway checks of a legacy completions request."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)


class CompletionsRequest(BaseModel):
    """A legacy completions request, as documented; the engine checks the rest."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    prompt: str | list[int] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = None
