"""What the worker and `claw-stream replay` do with the events: judge, reward rule, method,
gating.

Settings section `worker` (env CLAW_WORKER__<FIELD>, YAML `worker:`); `claw-stream replay`
(`rederive.py`) reads the same section from its `--config` file, so re-deriving samples is the
live pipeline with other knobs. Topic names are the settings' `topics:` section, shared with
the gateway and the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from claw_stream.names import DEFAULT_PRECEDENCE, SESSION_SIGNALS, SOURCE_NAME, Method, Signal

BUILTIN_SOURCES = ("prm", "rule", "rm", "external", "reaction")
# built-in scorers, run as the `rule` kind
BUILTIN_SCORERS = {"reaction": "claw_stream.worker.reaction:score"}


class RewardSourceSettings(BaseModel):
    """One reward source of the judge (docs/extending/reward-source.md). `use` is a built-in kind, or a user
    scorer by import path (`module:function`) or entry point name (group claw_stream.rewards),
    which is the `rule` kind with that function."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None,
        pattern=SOURCE_NAME,
        description="The signal's name in `precedence` and in each judgement; default: `use`.",
    )
    use: str = Field(
        default="prm",
        min_length=1,
        description="prm | rule | rm | external | reaction (the user's next words) | a user "
        "scorer.",
    )
    function: str | None = Field(
        default=None, description="rule: the scorer, module:function or an entry point name."
    )
    url: str | None = Field(
        default=None,
        description="external: the URL posted to; rm: the server's root (its /classify route).",
    )
    model: str | None = Field(default=None, description="rm: the model; default: the first.")
    api_key: str | None = Field(
        default=None,
        description="external, rm: the bearer token sent to url; None: no Authorization header.",
    )
    timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A score later than this is none (prm: judge_timeout_s per request, "
        "with its retries).",
    )
    votes: int | None = Field(
        default=None, ge=0, description="prm: votes per turn; default: worker.prm_votes."
    )
    threshold: float | None = Field(
        default=None,
        gt=0.5,
        le=1.0,
        description="prm: the share of votes a verdict (1 or -1) needs, else 0; default: the "
        "most common vote, a tie 0.",
    )
    prompt_file: Path | None = Field(
        default=None, description="prm: the judge prompt, with a {transcript} placeholder."
    )
    positive_label: int = Field(
        default=-1,
        description="rm: the class whose probability p is the score, as 2p - 1 (one-class "
        "reward models: the only class).",
    )

    @property
    def kind(self) -> str:
        return (
            self.use if self.use in BUILTIN_SOURCES and self.use not in BUILTIN_SCORERS else "rule"
        )

    @property
    def scorer(self) -> str | None:
        """rule: the user function's import path or entry point name."""
        if self.use in BUILTIN_SCORERS:
            return BUILTIN_SCORERS[self.use]
        return self.use if self.use not in BUILTIN_SOURCES else self.function

    @property
    def source_name(self) -> str:
        return self.name or self.use

    @model_validator(mode="after")
    def _fields_of_kind(self) -> RewardSourceSettings:
        if self.name is None and self.use not in BUILTIN_SOURCES:
            raise ValueError(f"reward source {self.use!r} needs a name")
        if self.kind == "rule" and not self.scorer:
            raise ValueError(f"reward source {self.source_name!r}: rule needs function")
        if self.kind in ("external", "rm") and not self.url:
            raise ValueError(f"reward source {self.source_name!r}: {self.kind} needs url")
        return self


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    app_id: str = Field(default="claw-worker", description="Faust app id = consumer group.")
    instance: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="This process's name among the workers of its app id on one data dir "
        "(`claw-stream up --workers N` names them worker-1..worker-N): its Faust data dir is "
        "DATA_DIR/worker/APP_ID/INSTANCE. None: DATA_DIR/worker/APP_ID.",
    )

    # judge: any OpenAI-compatible server; by default the built-in engine
    judge_url: str = Field(default="http://127.0.0.1:8001/v1", description="Base URL, with /v1.")
    judge_model: str | None = Field(default=None, description="Default: the server's first model.")
    judge_api_key: str | None = Field(
        default=None,
        description="The bearer token sent to the judge; None: no Authorization header.",
    )
    prm_votes: int = Field(default=3, ge=0, description="PRM votes per turn (m); 0 turns PRM off.")
    hint_votes: int = Field(default=3, ge=0, description="OPD hint votes per turn (opd, combine).")
    judge_temperature: float = Field(
        default=0.7, ge=0, description="Sampling temperature of the judge's votes."
    )
    judge_max_tokens: int = Field(
        default=4096,
        ge=1,
        description="Room for a thinking judge: its score comes after the thinking (a thinking "
        "model cut off at the old 256 never reached its box).",
    )
    judge_plain_max_tokens: int = Field(
        default=128,
        ge=1,
        description="Room for a judge that shows no thinking: a plain judge's box comes within a "
        "few sentences, and one that never writes it (a small model) costs this, not "
        "judge_max_tokens. An answer that shows thinking (<think>, or the server's reasoning "
        "field) gives the judge judge_max_tokens from then on (see judge_thinks).",
    )
    judge_thinks: bool | None = Field(
        default=None,
        description="Whether the judge thinks before its verdict: None finds out from its "
        "answers; true gives every vote judge_max_tokens (a model whose chat template opens "
        "the thinking in the prompt, served without a reasoning parser, shows no <think>); "
        "false always judge_plain_max_tokens.",
    )
    judge_stop_at_verdict: bool = Field(
        default=True,
        description="A vote ends at its box and a hint vote at its hint's end (stop strings the "
        "built-in engine and vLLM honour) instead of running on to judge_max_tokens. A judge "
        "that meets one inside its thinking, or a server that does not name the stop it met "
        "(a hosted API), is asked again without them, and from then on.",
    )
    judge_context_tokens: int | None = Field(
        default=None,
        ge=256,
        description="The judge model's context; default: the server's max_model_len, else 32768. "
        "The judge prompt is cut to fit (oldest history first).",
    )
    judge_chars_per_token: float = Field(
        default=3.0,
        gt=0,
        description="Characters per token assumed when bounding the judge prompt (conservative: "
        "English runs ~4, JSON and code ~3).",
    )
    judge_concurrency: int = Field(
        default=8,
        ge=1,
        description="Judge requests in flight; each asks for a turn's votes at once (n), so the "
        "judge generates up to this many times prm_votes answers together.",
    )
    judge_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Seconds one judge request may take before it fails (and is retried).",
    )
    judge_retries: int = Field(default=2, ge=0, description="Retries of a failed judge request.")
    judge_give_up_after_s: float = Field(
        default=3600.0,
        gt=0,
        description="A turn the judge cannot answer (timeouts, a busy or unreachable server) is "
        "kept and judged again with backoff for this long, then dead-lettered with the reason. "
        "A malformed answer is not retried.",
    )
    judge_backoff_max_s: float = Field(
        default=300.0, gt=0, description="The longest wait between judging a kept turn again."
    )
    turn_concurrency: int = Field(
        default=8,
        ge=1,
        description="Turns judged at once by replay (the worker: session_concurrency).",
    )
    session_concurrency: int = Field(
        default=16, ge=1, description="Sessions (or turns, when judging) handled at once per agent."
    )
    batch_max: int = Field(default=200, ge=1, description="Records an agent takes at once.")
    stream_buffer: int = Field(
        default=1024,
        ge=1,
        description="Records fetched ahead per agent (Faust's stream_buffer_maxsize). More keeps "
        "the worker busy while a batch waits on Postgres or the broker (in "
        "bench/pipeline_bench.py 256 left it 0.79 of a core busy, 1024 0.87), at the cost of up "
        "to this many raw records in memory per agent.",
    )
    batch_within_s: float = Field(
        default=0.02, gt=0, description="How long an agent waits to fill a batch."
    )

    # samples
    method: Method = Field(
        default="binary",
        description="What the worker makes of each turn: binary a reward, opd an OPD hint and "
        "the teacher's log-probs, combine both. Set trainer.method alike.",
    )
    distil_skills: bool = Field(
        default=True,
        description="A call that carried skills is trained without them: its sample's prompt is "
        "the call's own messages, its answer the one sampled with the skills, and with opd or "
        "combine its teacher the policy with them (context distillation), so a version learns "
        "what the skills taught and answers so where none are injected.",
    )
    reward_rule: Literal["override", "join"] = Field(
        default="override",
        description="override: the first signal in `precedence` is the reward; "
        "join: the mean of every signal present.",
    )
    precedence: list[Signal] = Field(
        default_factory=lambda: list(DEFAULT_PRECEDENCE),
        description="Signals by name: explicit, feedback, episode and the reward sources' "
        "names. Default: the first three, then every source in the order of `rewards`.",
    )
    rewards: list[RewardSourceSettings] = Field(
        default_factory=lambda: [
            RewardSourceSettings(use="reaction"),
            RewardSourceSettings(use="prm"),
        ],
        description="Reward sources that score each turn; every score is recorded in the "
        "judgement, `precedence` and `reward_rule` combine them. Default: the user's reaction "
        "(their next words), where it abstains the PRM: a small PRM cannot read thanks or a "
        "correction (SmolLM2-135M voted 0 on every one in bench/judge_agreement_bench.py).",
    )
    hint_prompt_file: Path | None = Field(
        default=None,
        description="OPD hint prompt, with a {transcript} placeholder; default: the built-in.",
    )
    gamma: float = Field(default=0.9, ge=0, le=1, description="Discount of episode rewards.")
    max_staleness: int = Field(default=4, ge=0, description="Versions behind before a drop.")
    at_least_one_per_session: bool = Field(
        default=True,
        description="A session (per_turn: a segment) none of whose samples has a learning "
        "signal still sends its last one to training; off: samples without a signal are "
        "never trained.",
    )
    release: Literal["per_turn", "per_episode"] | None = Field(
        default=None,
        description="per_turn: a turn's sample leaves once its judgement and its own signals "
        "are final; episode rewards become samples of their own when their episode closes. "
        "per_episode: a segment's samples leave when it closed and every turn is judged. "
        "Default: per_episode when `precedence` puts 'episode' first, else per_turn.",
    )
    signal_grace_s: float = Field(
        default=2.0,
        ge=0,
        description="per_turn: how long after its judgement a turn waits for thumbs or an "
        "explicit reward aimed at it before its sample is assembled.",
    )

    token_drift: Literal["keep", "drop"] = Field(
        default="keep",
        description="A turn whose prompt ids do not continue the previous turn's prompt and "
        "answer ids where its messages do (`Turn.token_drift`): always counted "
        "(claw_token_drift_total), recorded (turns.token_drift) and shown by `doctor`; keep: "
        "trained on its own ids, which are exactly what the engine read and sampled (the "
        "trainer packs it apart); drop: dead-lettered (token_drift), never judged or trained. "
        "Keep by default: in a real OpenClaw conversation on SmolLM2 one of three continuing "
        "turns parted where re-encoding the sampled answer split a word otherwise.",
    )

    # sessions
    idle_timeout_s: float = Field(
        default=900.0, gt=0, description="A session with no step for this long is closed."
    )
    tail_timeout_s: float = Field(
        default=86400.0,
        gt=0,
        description="per_turn: an idle close keeps the segment's last main step open, so the "
        "user's message when the conversation resumes is its next state; after this long "
        "without one it is judged without.",
    )
    reorder_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="How long a missing turn index (a step still in flight) is waited for.",
    )
    update_timeout_s: float = Field(
        default=900.0, gt=0, description="An 'updating' with no 'ready' after this stops holding."
    )
    sweep_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often, in seconds, the sweeper runs: it closes idle sessions, judges "
        "kept turns again, releases held samples and resends lost ones.",
    )
    step_cache_mb: float = Field(
        default=32.0,
        ge=0,
        description="Decoded steps kept in memory (by their JSON size) so that the stitcher "
        "does not decode a session's history from Postgres again on each of its steps; "
        "Python holds 1-6x this. 0 turns it off.",
    )
    own_events_mb: float = Field(
        default=16.0,
        ge=0,
        description="Turns and judgements this worker sent, kept (by their JSON size) until it "
        "reads them back, so that it need not decode its own records again; another worker's "
        "records are always decoded. 0 turns it off.",
    )
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description="Prometheus.")
    metrics_host: str = Field(
        default="127.0.0.1", description="Address the worker's Prometheus /metrics listens on."
    )
    orphan_after_s: float = Field(
        default=15.0, gt=0, description="A sample still unpublished after this is recovered."
    )
    retrain_after_s: float = Field(
        default=600.0,
        gt=0,
        description="A published sample no training step recorded after this is looked for "
        "on the samples topic, and published again when the broker lost it.",
    )
    lost_check_every_s: float = Field(
        default=60.0, gt=0, description="How often the sweeper looks for such samples."
    )

    @field_validator("precedence")
    @classmethod
    def _distinct(cls, value: list[Signal]) -> list[Signal]:
        if not value or len(set(value)) != len(value):
            raise ValueError("precedence must list distinct signals")
        return value

    @model_validator(mode="after")
    def _sources_and_precedence(self) -> WorkerSettings:
        names = [r.source_name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ValueError(f"reward sources need distinct names, got {names}")
        if sum(r.kind == "prm" for r in self.rewards) > 1:
            raise ValueError("one prm reward source at most")
        clash = set(names) & set(SESSION_SIGNALS)
        if clash:
            raise ValueError(f"reward source names {sorted(clash)} are session signals")
        if "precedence" not in self.model_fields_set:
            self.precedence = [*SESSION_SIGNALS, *names]
        known = {*SESSION_SIGNALS, "prm", *names}
        unknown = [p for p in self.precedence if p not in known]
        if unknown:
            raise ValueError(
                f"precedence names {unknown}, which are neither session signals "
                f"{list(SESSION_SIGNALS)} nor reward sources {names}"
            )
        return self

    @property
    def prm_source(self) -> RewardSourceSettings | None:
        return next((r for r in self.rewards if r.kind == "prm"), None)

    @property
    def prm_vote_count(self) -> int:
        """PRM votes per turn: 0 without a prm source."""
        source = self.prm_source
        if source is None:
            return 0
        return source.votes if source.votes is not None else self.prm_votes

    @property
    def plugin_sources(self) -> list[RewardSourceSettings]:
        """The sources other than prm (the judge runs prm with its hints)."""
        return [r for r in self.rewards if r.kind != "prm"]

    @property
    def release_mode(self) -> Literal["per_turn", "per_episode"]:
        if self.release is not None:
            return self.release
        return "per_episode" if self.precedence[0] == "episode" else "per_turn"

    @property
    def needs_hints(self) -> bool:
        return self.method in ("opd", "combine") and self.hint_votes > 0
