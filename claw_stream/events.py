"""The event contract: every payload that travels on a claw.* topic.

One module, like vLLM's protocol.py: producers build these models, consumers decode with
`decode_event`, and `topics/schemas/*.json` is generated from them (`claw-stream topics schemas`).
Validation is strict: unknown fields, wrong types, lengths that disagree and non-finite numbers
are rejected with an `EventError` that names the offending field.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from claw_stream.ids import uuid7
from claw_stream.names import Method, RewardSourceName, Vote

SCHEMA_VERSION: Literal[1] = 1


def _check_uuid7(value: uuid.UUID) -> uuid.UUID:
    if value.version != 7:
        raise ValueError(f"must be a UUIDv7, got version {value.version}")
    return value


UUID7 = Annotated[uuid.UUID, AfterValidator(_check_uuid7)]
SessionId = Annotated[str, Field(min_length=1, max_length=256)]
TokenId = Annotated[int, Field(ge=0)]
Logprob = Annotated[float, Field(le=0.0, allow_inf_nan=False)]
Version = Annotated[int, Field(ge=0)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _now() -> datetime:
    return datetime.now(UTC)


class _Strict(BaseModel):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        allow_inf_nan=False,
        json_schema_serialization_defaults_required=True,
    )


class Event(_Strict):
    """Base of every topic payload: a schema version, a UUIDv7 id (named per type), a time."""

    id_field: ClassVar[str]

    schema_version: Literal[1] = SCHEMA_VERSION
    created_at: AwareDatetime = Field(default_factory=_now)

    @property
    def id(self) -> uuid.UUID:
        return getattr(self, self.id_field)


# --- chat payloads, normalised by the gateway ------------------------------------------------


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, exactly as the model produced it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    """A message with its content flattened to text (list-of-text-parts joined)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class SamplingParams(_Strict):
    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    stop: list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1)


class StepRequest(_Strict):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Other fields the client sent, passed through."
    )


class StepResponse(_Strict):
    message: ChatMessage
    finish_reason: Literal["stop", "length", "tool_calls", "content_filter", "abort"] | None

    @model_validator(mode="after")
    def _assistant(self) -> StepResponse:
        if self.message.role != "assistant":
            raise ValueError("response.message.role must be 'assistant'")
        return self


class Usage(_Strict):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


# --- topic payloads ----------------------------------------------------------------------------


class Step(Event):
    """One LLM call through the gateway, with exactly the tokens the engine sampled."""

    id_field: ClassVar[str] = "step_id"

    step_id: UUID7 = Field(default_factory=uuid7)
    session_id: SessionId
    group_id: str | None = None
    turn_type: Literal["main", "side"] = "main"
    turn_index: int = Field(ge=0)
    request: StepRequest
    response: StepResponse
    prompt_token_ids: list[TokenId] = Field(
        description="Empty only in a step that is not trained whose prompt held a redacted "
        "secret (the gateway masks it), or in one answered by a hosted API "
        "(`gateway.backend_kind: hosted`), which has no token ids at all: judged, never "
        "trained."
    )
    response_token_ids: list[TokenId]
    response_logprobs: list[Logprob]
    weight_version: Version
    train: bool = Field(
        default=True,
        description="False: archived, never judged or trained (X-Claw-Train: false, a session "
        "or key switched off, or a redacted secret in the prompt).",
    )
    response_weight_versions: list[Version] | None = Field(
        default=None, description="Per-token policy versions when a weight swap spanned the call."
    )
    engine: str
    served_model: str | None = Field(
        default=None,
        description="The model name the engines served the call as (request.model is the name "
        "the client asked for); None in events recorded before the gateway mapped names.",
    )
    tenant: str | None = Field(
        default=None,
        description="Whose agent the call served (claw_stream/tenants.py); served_model names "
        "the tenant's adapter (`tenant@vN`) where it had one. None: no tenant.",
    )
    latency_ms: float = Field(ge=0, allow_inf_nan=False)
    usage: Usage

    @model_validator(mode="after")
    def _lengths(self) -> Step:
        n = len(self.response_token_ids)
        if len(self.response_logprobs) != n:
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries "
                f"for {n} response_token_ids (one per sampled token)"
            )
        if self.response_weight_versions is not None and len(self.response_weight_versions) != n:
            raise ValueError("response_weight_versions must have one entry per response token")
        if not self.prompt_token_ids and self.train and self.response_token_ids:
            raise ValueError(
                "prompt_token_ids may be empty only in a step with train false, or one with no "
                "token ids at all (a hosted API's)"
            )
        return self


class SessionEvent(Event):
    id_field: ClassVar[str] = "event_id"

    event_id: UUID7 = Field(default_factory=uuid7)
    session_id: SessionId
    kind: Literal["started", "refreshed", "ended", "reward", "feedback", "train", "forgotten"]
    group_id: str | None = None
    step_id: UUID7 | None = Field(default=None, description="The step a reward/feedback targets.")
    reward: FiniteFloat | None = None
    score: Vote | None = Field(default=None, description="Thumbs: -1, 0 or 1.")
    text: str | None = None
    reason: str | None = Field(default=None, description="Why a session ended or was refreshed.")
    n_steps: int | None = Field(
        default=None,
        ge=0,
        description="ended / refreshed: how many steps the gateway counted in the session, so "
        "the stitcher closes it only once all of them arrived.",
    )
    train: bool | None = Field(
        default=None,
        description="train: whether the session's steps from now on are trained; turns not "
        "judged yet and samples no trainer took are withdrawn when false.",
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="started / reward: what the client passed with `/rl/start_session` or "
        "`/rl/set_reward` (a task's ground truth, for example); reward sources read it.",
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> SessionEvent:
        if self.kind == "reward" and self.reward is None:
            raise ValueError("a 'reward' event needs reward")
        if self.kind == "feedback" and self.score is None and not self.text:
            raise ValueError("a 'feedback' event needs score or text")
        if self.kind == "train" and self.train is None:
            raise ValueError("a 'train' event needs train")
        return self


class Turn(Event):
    """A main-line step with its next state: what the following main step added after it."""

    id_field: ClassVar[str] = "turn_id"

    turn_id: UUID7
    session_id: SessionId
    step: Step
    next_state: list[ChatMessage] | None = Field(
        default=None, description="Tool results / the user's reply that followed; None if closed."
    )
    next_step_id: UUID7 | None = None
    closed_reason: Literal[
        "next_step", "superseded", "session_ended", "refreshed", "done", "idle_timeout"
    ] = Field(
        description="superseded: the next main step re-asked the same turn (a client retry), "
        "so this answer had no next state."
    )
    is_last: bool = False
    segment: int | None = Field(
        default=None,
        ge=0,
        description="The session's segment (episode) of the step: steps after an end or an idle "
        "close open the next one. None in events from before segments (segment 0).",
    )
    token_drift: str | None = Field(
        default=None,
        description="Set when the step's messages continue the previous main step's (its "
        "messages and answer) but its prompt token ids do not continue that step's prompt and "
        "answer ids: where they part (worker.token_drift says whether it is trained).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Turn:
        if self.step.session_id != self.session_id:
            raise ValueError("step.session_id differs from session_id")
        if self.step.turn_type != "main":
            raise ValueError("only main-line steps become turns")
        if self.closed_reason == "next_step" and (self.next_state is None or not self.next_step_id):
            raise ValueError("closed_reason 'next_step' needs next_state and next_step_id")
        return self


class HintVote(_Strict):
    score: Vote
    hint: str | None = None
    raw: str


class SourceScore(_Strict):
    """What one reward source said about a turn: a score and why, or the error it failed with
    (then the turn is judged without it)."""

    source: RewardSourceName
    score: FiniteFloat | None = None
    explanation: str | None = None
    error: str | None = None


class Judgement(Event):
    id_field: ClassVar[str] = "judgement_id"

    judgement_id: UUID7
    session_id: SessionId
    turn: Turn
    judge_model: str
    prm_votes: list[Vote] = Field(default_factory=list)
    prm_raw: list[str] = Field(default_factory=list)
    prm_score: Vote | None = None
    hint_votes: list[HintVote] = Field(default_factory=list)
    hint: str | None = None
    teacher_logprobs: list[Logprob] | None = None
    prompt_without_skills: list[TokenId] | None = Field(
        default=None,
        description="Where the call carried skills: its prompt's token ids without them, as the "
        "model's chat template renders the Step's own messages (the sample's prompt when the "
        "worker distils skills into the weights).",
    )
    explicit_reward: FiniteFloat | None = None
    feedback_score: Vote | None = None
    feedback_text: str | None = None
    history_cut: int | None = Field(
        default=None,
        ge=0,
        description="How many of the oldest history messages were left out of the judge prompt "
        "to fit the judge's context (0: none; None: from before the prompt was bounded).",
    )
    rewards: list[SourceScore] = Field(
        default_factory=list,
        description="Every reward source's score of the turn (prm included), by source name.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Judgement:
        if len(self.prm_votes) != len(self.prm_raw):
            raise ValueError("prm_votes and prm_raw must have the same length")
        if self.teacher_logprobs is not None:
            n = len(self.turn.step.response_token_ids)
            if len(self.teacher_logprobs) != n:
                raise ValueError(
                    f"teacher_logprobs has {len(self.teacher_logprobs)} entries for {n} response tokens"
                )
        return self


class Sample(Event):
    """Ready for training: the sampled tokens, their behaviour logprobs and the learning signal."""

    id_field: ClassVar[str] = "sample_id"

    sample_id: UUID7
    session_id: SessionId
    group_id: str | None = None
    step_id: UUID7
    turn_id: UUID7
    method: Method
    prompt_token_ids: list[TokenId] = Field(min_length=1)
    response_token_ids: list[TokenId] = Field(min_length=1)
    response_logprobs: list[Logprob]
    teacher_logprobs: list[Logprob] | None = None
    reward: FiniteFloat
    reward_source: RewardSourceName
    weight_version: Version = Field(description="The policy version that generated the response.")
    released_at_version: Version
    tenant: str | None = Field(
        default=None, description="The tenant of its Step: whose adapter it may train."
    )
    policy: str | None = Field(
        default=None,
        description="Whose version weight_version is: the tenant's when its adapter (`tenant@vN`) "
        "answered; None: the shared policy's.",
    )
    without_skills: bool = Field(
        default=False,
        description="Its prompt is the call's without the skills it carried, while the answer "
        "and response_logprobs were sampled with them: the skills are distilled into the "
        "weights (the trainer gives it no importance weight against that other context).",
    )

    @model_validator(mode="after")
    def _lengths(self) -> Sample:
        n = len(self.response_token_ids)
        if len(self.response_logprobs) != n:
            raise ValueError("response_logprobs must have one entry per response token")
        if self.teacher_logprobs is not None and len(self.teacher_logprobs) != n:
            raise ValueError("teacher_logprobs must have one entry per response token")
        if self.method in ("opd", "combine") and self.teacher_logprobs is None:
            raise ValueError(f"method '{self.method}' needs teacher_logprobs")
        if self.released_at_version < self.weight_version:
            raise ValueError("released_at_version is older than weight_version")
        return self


class WeightEvent(Event):
    id_field: ClassVar[str] = "weight_event_id"

    weight_event_id: UUID7 = Field(default_factory=uuid7)
    policy: str = Field(min_length=1)
    version: Version
    # ready: the serving engines serve this version now (even one older than an earlier ready:
    # a rollback). candidate (serving.policy gated): trained and loaded on the candidate
    # engines only; rejected: its evaluation was worse than the serving version's (error says
    # both scores).
    status: Literal["updating", "ready", "failed", "candidate", "rejected"]
    kind: Literal["full", "lora"] = "full"
    checkpoint_path: str | None = None
    adapter_name: str | None = None
    trainer_step: int | None = Field(default=None, ge=0)
    error: str | None = None
    rolled_back_from: Version | None = Field(
        default=None, description="On the 'ready' of a rollback: the version served before."
    )
    reason: str | None = Field(
        default=None,
        description="On the 'ready' of a rollback: why (the watchdog's finding, or who did it).",
    )

    @model_validator(mode="after")
    def _failed_has_error(self) -> WeightEvent:
        if self.status in ("failed", "rejected") and not self.error:
            raise ValueError(f"a '{self.status}' weight event needs error")
        if self.rolled_back_from is not None and self.status != "ready":
            raise ValueError("rolled_back_from goes on a 'ready' event only")
        if self.reason is not None and self.rolled_back_from is None:
            raise ValueError("reason goes on a rollback's 'ready' event only")
        return self


class DeadLetter(Event):
    """A record a processor could not parse or handle, kept whole with the reason."""

    id_field: ClassVar[str] = "dead_letter_id"

    dead_letter_id: UUID7 = Field(default_factory=uuid7)
    source_topic: str
    partition: int | None = Field(default=None, ge=0)
    offset: int | None = Field(default=None, ge=0)
    key: str | None = None
    value: str = Field(description="The original value: UTF-8 text, or base64 when not text.")
    value_encoding: Literal["utf-8", "base64"] = "utf-8"
    error_type: str
    error: str
    processor: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (Step, SessionEvent, Turn, Judgement, Sample, WeightEvent, DeadLetter)
}


# --- encoding ------------------------------------------------------------------------------------


class EventError(ValueError):
    """A payload that does not satisfy the contract; `fields` names each offending field."""

    def __init__(self, model: str, problems: list[tuple[str, str]]):
        self.model = model
        self.problems = problems
        self.fields = [loc for loc, _ in problems]
        detail = "; ".join(f"{loc}: {msg}" for loc, msg in problems)
        super().__init__(f"invalid {model}: {detail}")


E = TypeVar("E", bound=Event)


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def decode_event(model: type[E], raw: bytes | str) -> E:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        problems = [(_loc(err["loc"]), err["msg"]) for err in exc.errors(include_url=False)]
        raise EventError(model.__name__, problems) from None


def encode_event(event: Event) -> bytes:
    return event.model_dump_json(exclude_none=False).encode()
