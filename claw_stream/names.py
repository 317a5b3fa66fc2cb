"""Names every service shares: topics, training methods, reward sources, adapter names, headers.

One place, imported by all: the gateway, the workers, replay and the trainer read their topic
names from the one `topics:` settings section (env CLAW_TOPICS__<ROLE>), so renaming a topic
moves every service. `topics/*.yaml` holds each topic's spec under its default name; a test
checks that the two agree.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

Method = Literal["binary", "opd", "combine"]
METHODS: tuple[str, ...] = get_args(Method)

# Where a sample's reward came from: a session signal (explicit, feedback, episode), one of
# the worker's reward sources by its name (`prm`, a rule, a reward model, ...), or none. The
# signals are ordered by `worker.precedence`. A name fits the samples table's column (16).
SOURCE_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,15}$"
Signal = Annotated[str, Field(pattern=SOURCE_NAME)]
RewardSourceName = Annotated[str, Field(pattern=SOURCE_NAME)]
SESSION_SIGNALS: tuple[str, ...] = ("explicit", "feedback", "episode")
SIGNALS: tuple[str, ...] = (*SESSION_SIGNALS, "prm")
DEFAULT_PRECEDENCE: tuple[str, ...] = ("explicit", "feedback", "episode", "prm")
Vote = Literal[-1, 0, 1]

TopicName = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")]


class Topics(BaseModel):
    """The topic of each role (settings section `topics:`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: TopicName = Field(
        default="claw.steps",
        description="The Steps: one per LLM call through the gateway; the replay source, kept "
        "forever.",
    )
    session_events: TopicName = Field(
        default="claw.session-events",
        description="Session events: a session's start and end, explicit rewards, feedback and "
        "training switches.",
    )
    turns: TopicName = Field(
        default="claw.turns",
        description="Turns: the worker's main-line steps with their next state attached.",
    )
    judgements: TopicName = Field(
        default="claw.judgements",
        description="Each turn's judgement: reward sources' scores, PRM votes, OPD hints and "
        "teacher log-probs.",
    )
    samples: TopicName = Field(
        default="claw.samples",
        description="Samples ready for training, which the trainer reads (unless "
        "trainer.samples_topic names another).",
    )
    weights: TopicName = Field(
        default="claw.weights",
        description="Weight version events (updating, ready, failed, candidate) per policy; "
        "they hold back the release of samples during an update.",
    )
    dlq: TopicName = Field(
        default="claw.dlq",
        description="Dead letters: records a service could not parse or handle, with the error.",
    )

    def by_role(self) -> dict[str, str]:
        return self.model_dump()


# The spec file of each role under topics/ (its default name).
DEFAULT_TOPICS = Topics()


# --- policy versions served as LoRA adapters ------------------------------------------------

_ADAPTER = re.compile(r"^(?P<policy>.+)@v(?P<version>\d+)$")


def adapter_name(policy: str, version: int) -> str:
    """The adapter the trainer publishes for `version` of `policy`: `policy@vN`."""
    return f"{policy}@v{version}"


def adapter_policy(name: str | None) -> str | None:
    """`policy` of an adapter named `policy@vN`; None for any other name."""
    match = _ADAPTER.match(name or "")
    return match["policy"] if match else None


def adapter_version(name: str | None) -> int | None:
    """N of an adapter named `policy@vN`; None for any other name."""
    match = _ADAPTER.match(name or "")
    return int(match["version"]) if match else None


def policy_model(cards: list[dict[str, Any]]) -> str:
    """The policy's name in a `/v1/models` list: the first model that is no adapter
    (`name@vN`); a tenant's call to it is served by the tenant's newest adapter."""
    return next((c["id"] for c in cards if adapter_version(c["id"]) is None), cards[0]["id"])


# the judge_model of a held-out turn's judgement row: not judged, not trained, replayed by each
# new version (claw_stream.ids.is_held_out, eval.holdout_share)
HELD_OUT = "held-out"


# --- HTTP headers every front answers with --------------------------------------------------

VERSION_HEADER = "X-Claw-Weight-Version"
STEP_HEADER = "X-Claw-Step-Id"
