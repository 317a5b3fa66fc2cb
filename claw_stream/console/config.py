"""Settings section `console:` (env CLAW_CONSOLE__<FIELD>)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConsoleSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="The gateway serves /console.")
    page_size: int = Field(default=50, ge=1, le=500, description="Sessions per page.")
    turns_per_page: int = Field(
        default=20,
        ge=1,
        le=500,
        description="A session's turns per page (an OpenClaw turn brings ~60 KB of prompt).",
    )
    refresh_s: int = Field(
        default=10, ge=0, description="The overview reloads itself this often; 0: never."
    )
    gateway_url: str | None = Field(
        default=None,
        description="`claw-stream console` alone: the gateway whose routes its buttons call "
        "(default: the settings' gateway host and port). Served by the gateway: itself.",
    )
    host: str = Field(
        default="127.0.0.1", description="Address `claw-stream console` alone listens on."
    )
    port: int = Field(default=8090, ge=1, le=65535, description="`claw-stream console` alone.")
