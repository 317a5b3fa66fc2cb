"""Settings section `skills:` (env CLAW_SKILLS__<FIELD>)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SOURCES = ("correction", "feedback", "hint", "label")


class SkillsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="The worker learns skills and the gateway adds them to main calls' prompts "
        "(a call or a session opts out with the header `X-Claw-Skills: off`).",
    )
    max_tokens: int = Field(
        default=160,
        ge=16,
        le=4096,
        description="The most tokens the skills block may add to a prompt (estimated at "
        "~4 characters a token; the Step records the exact prompt).",
    )
    position: Literal["first_user", "system"] = Field(
        default="first_user",
        description="Where the block goes: after the first user message's text (small models "
        "follow it there), or at the end of the system prompt. Both stay put across a "
        "session's calls (prefix cache).",
    )
    max_skills: int = Field(
        default=8, ge=1, le=64, description="The most skills one prompt carries."
    )
    promote_min_users: int = Field(
        default=3,
        ge=2,
        description="A lesson that this many different users taught applies to everyone on "
        "the policy; one user's skills reach only that user's calls.",
    )
    similarity: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="Two lessons whose word sets overlap this much (Jaccard) are one skill, "
        "confirmed again, rather than two.",
    )
    sources: list[str] = Field(
        default_factory=lambda: list(SOURCES),
        description="What skills are learned from: correction (the user's next words after "
        "a wrong answer), feedback (/rl/feedback text), hint (the judge's hint on an answer "
        "scored wrong), label (a console label's note).",
    )
    refresh_s: float = Field(
        default=2.0,
        gt=0,
        description="The gateway checks a user's skills for changes at most this often.",
    )
