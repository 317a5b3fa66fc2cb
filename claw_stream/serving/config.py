"""Settings section `serving:` (env CLAW_SERVING__<FIELD>): which trained version is served."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: Literal["latest", "gated"] = Field(
        default="latest",
        description="latest: every version the trainer publishes is served at once. gated: a "
        "new version is a candidate, loaded on the candidate engines only, and served once "
        "`claw-stream eval --follow` found its score not worse than the serving version's by "
        "more than `margin`.",
    )
    margin: float = Field(
        default=0.0,
        ge=0,
        description="A candidate is promoted when its score >= the serving version's - margin.",
    )
    candidate_engines: list[str] = Field(
        default_factory=list,
        description="Engines that load candidates for evaluation (gated); `claw-stream up` "
        "starts one on engine.port + 100 when this is empty.",
    )
