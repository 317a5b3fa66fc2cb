"""Settings section `eval:` (env CLAW_EVAL__<FIELD>): what `claw-stream eval` plays."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(
        default="arithmetic-heldout", description="A shipped dataset name or a JSONL file."
    )
    agent: Literal["tool-call", "terminal", "chat"] = Field(
        default="tool-call",
        description="How a task is played: tool-call with the task's Python tools, terminal "
        "with a `run` tool in a scratch folder, chat with no tools.",
    )
    limit: int | None = Field(default=None, ge=1, description="The first N tasks only.")
    attempts: int = Field(default=1, ge=1, description="Episodes per task.")
    temperature: float = Field(default=0.0, ge=0, description="0: greedy, comparable runs.")
    max_tokens: int = Field(
        default=128,
        ge=1,
        description="Longest answer per model call, in tokens (the tasks and the replay).",
    )
    max_turns: int = Field(default=4, ge=1, description="Model calls per episode at most.")
    concurrency: int = Field(default=4, ge=1, description="Episodes played at once.")
    on_ready: bool = Field(
        default=False,
        description="`claw-stream up` runs `claw-stream eval --follow`: every version the "
        "trainer announces ready is evaluated once.",
    )
    holdout_share: float = Field(
        default=0.1,
        ge=0,
        le=0.5,
        description="The share of each user's main-line turns held out of training (chosen by "
        "a hash of the turn: stable), answered again by each new version (the replay).",
    )
    replay: bool = Field(
        default=True,
        description="`eval --follow` replays the held-out turns on each new version, and "
        "under serving.policy gated on each candidate (a promotion criterion).",
    )
    replay_limit: int = Field(default=20, ge=1, description="The newest N held-out turns.")
    replay_votes: int = Field(
        default=1, ge=1, description="Judge votes per pair and order (m): 2m requests a pair."
    )
    judge_url: str | None = Field(
        default=None,
        description="The replay's judge, an OpenAI-compatible base URL with /v1; default: "
        "the worker's judge (worker.judge_url). A separate, larger judge where the embedded "
        "one agrees with a rule no better than a coin.",
    )
    judge_model: str | None = Field(default=None, description="Default: the server's first.")
    replay_rule: str | None = Field(
        default=None,
        description="A rule that scores an answer to a request, `fn(request, answer) -> float` "
        "(module:function or an entry point of claw_stream.rewards): where set, it decides the "
        "replay's pairs and the judge's votes are kept beside it (their agreement is reported).",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address the Prometheus /metrics of `eval --follow` listens on.",
    )
    metrics_port: int | None = Field(
        default=9402, ge=1, le=65535, description="Prometheus of `eval --follow`; None: off."
    )
