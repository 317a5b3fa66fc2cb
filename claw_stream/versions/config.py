"""Settings section `serving:` (env CLAW_SERVING__<FIELD>): which trained version is served."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class WatchdogSettings(BaseModel):
    """`serving.watchdog`: under `latest`, roll back when new versions do worse on held-out."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=False,
        description="Under serving.policy latest, with eval.on_ready: after each version is "
        "evaluated, roll back to the best recent version when the last `patience` versions "
        "each lost to it on the held-out tasks (win rate below 0.5 - margin).",
    )
    margin: float = Field(
        default=0.1,
        ge=0,
        le=0.5,
        description="A version loses when its held-out win rate against the best recent one "
        "is below 0.5 - margin (a tie counts half).",
    )
    patience: int = Field(
        default=2, ge=1, description="Consecutive versions that must lose (K) before it acts."
    )
    window: int = Field(
        default=4,
        ge=1,
        description="The best is chosen among this many versions evaluated before those K.",
    )


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
    replay_margin: float = Field(
        default=0.1,
        ge=0,
        le=0.5,
        description="gated, with eval.replay: a candidate must also win at least 0.5 - "
        "replay_margin of the held-out turns against the answers the users got (a tie half).",
    )
    candidate_engines: list[str] = Field(
        default_factory=list,
        description="Engines that load candidates for evaluation (gated); `claw-stream up` "
        "starts one on engine.port + 100 when this is empty.",
    )
    watchdog: WatchdogSettings = Field(
        default_factory=WatchdogSettings,
        description="Under `latest`: roll back when new versions do worse on held-out tasks.",
    )
