"""A session's judgements and signals become samples: reward, method, learning signal.

Pure: the worker calls it on what Postgres holds for a session, `claw-stream replay`
(`rederive.py`) on what it re-derived.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from claw_stream.events import Judgement, Sample, SessionEvent, Step
from claw_stream.ids import derive_uuid7
from claw_stream.names import adapter_policy
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.logic.rewards import (
    Signals,
    discounted,
    has_signal,
    source_scores,
    step_reward,
)


@dataclass(frozen=True)
class Draft:
    """A sample before release: `released_at_version` is set when it is released."""

    sample: Sample
    has_signal: bool


def sample_id_of(judgement_id: uuid.UUID, method: str, topic: str) -> uuid.UUID:
    return derive_uuid7(judgement_id, f"sample:{method}:{topic}")


StepTime = tuple[uuid.UUID, datetime]  # a main step's id and creation time


def _session_signals(
    steps: list[StepTime], events: list[SessionEvent]
) -> tuple[dict[uuid.UUID, float], dict[uuid.UUID, int], float | None]:
    """Per-step explicit rewards, per-step thumbs and the episode reward (the latest wins).
    Thumbs with no step go to "the last answer": the latest of `steps` made before them."""
    explicit: dict[uuid.UUID, float] = {}
    thumbs: dict[uuid.UUID, int] = {}
    episode: float | None = None
    steps = sorted(steps, key=lambda s: s[1])
    for event in sorted(events, key=lambda e: (e.created_at, e.event_id)):
        if event.kind == "reward" and event.reward is not None:
            if event.step_id is None:
                episode = event.reward
            else:
                explicit[event.step_id] = event.reward
        elif event.kind == "feedback" and event.score is not None:
            target = event.step_id
            if target is None:  # thumbs on "the last answer": the latest step before it
                before = [s for s in steps if s[1] <= event.created_at] or steps
                target = before[-1][0] if before else None
            if target is not None:
                thumbs[target] = event.score
    return explicit, thumbs, episode


def _draft(
    judgement: Judgement,
    signals: Signals,
    config: WorkerSettings,
    sample_id: uuid.UUID,
    precedence: list[str] | None = None,
) -> Draft | None:
    step = judgement.turn.step
    if not step.response_token_ids:
        return None  # an empty answer has no token to learn from
    reward, source = step_reward(signals, precedence or config.precedence, config.reward_rule)
    teacher = judgement.teacher_logprobs if config.method != "binary" else None
    # the call's skills distilled: the prompt without them, the answer sampled with them
    plain = judgement.prompt_without_skills if config.distil_skills else None
    signal = has_signal(config.method, reward, teacher is not None or plain is not None)
    if config.method != "binary" and teacher is None:
        # no accepted hint: the teacher is the behaviour policy, which read the skills where the
        # call carried some (a distillation term on the prompt without them), else it agrees
        # with the policy and the sample adds none (batches stay homogeneous for the trainer)
        teacher = step.response_logprobs
    sample = Sample(
        sample_id=sample_id,
        session_id=step.session_id,
        group_id=step.group_id,
        step_id=step.step_id,
        turn_id=judgement.turn.turn_id,
        method=config.method,
        prompt_token_ids=plain or step.prompt_token_ids,
        response_token_ids=step.response_token_ids,
        response_logprobs=step.response_logprobs,
        teacher_logprobs=teacher,
        reward=reward,
        reward_source=source,
        weight_version=step.weight_version,
        released_at_version=step.weight_version,
        tenant=step.tenant,
        policy=served_by(step),
        without_skills=plain is not None,
    )
    return Draft(sample, signal)


def served_by(step: Step) -> str | None:
    """The tenant whose adapter answered the step (its versions are the tenant's), if any."""
    owner = adapter_policy(step.served_model)
    return owner if owner is not None and owner == step.tenant else None


def _in_order(judgements: list[Judgement]) -> list[Judgement]:
    return sorted(judgements, key=lambda j: (j.turn.step.turn_index, j.turn.step.created_at))


def assemble_session(
    judgements: list[Judgement], events: list[SessionEvent], config: WorkerSettings, topic: str
) -> list[Draft]:
    """per_episode (and re-deriving): one draft per judged turn of a closed episode, in turn order,
    its reward the first signal by `precedence` (the episode reward discounted back)."""
    judgements = _in_order(judgements)
    steps = [(j.turn.step.step_id, j.turn.step.created_at) for j in judgements]
    explicit, thumbs, episode = _session_signals(steps, events)
    episode_rewards = (
        discounted(episode, len(judgements), config.gamma) if episode is not None else None
    )
    drafts: list[Draft] = []
    for k, judgement in enumerate(judgements):
        step = judgement.turn.step
        signals = Signals(
            explicit=explicit.get(step.step_id),
            feedback=thumbs.get(step.step_id),
            episode=episode_rewards[k] if episode_rewards else None,
            prm=judgement.prm_score,
            sources=source_scores(judgement),
        )
        sample_id = sample_id_of(judgement.judgement_id, config.method, topic)
        draft = _draft(judgement, signals, config, sample_id)
        if draft is not None:
            drafts.append(draft)
    if config.at_least_one_per_session and drafts and not any(d.has_signal for d in drafts):
        drafts[-1] = Draft(drafts[-1].sample, True)  # the session's one sample, even at zero
    return drafts


def turn_drafts(
    judgements: list[Judgement],
    steps: list[StepTime],
    events: list[SessionEvent],
    config: WorkerSettings,
    topic: str,
) -> list[Draft]:
    """per_turn: each judged turn's own sample, from its own signals (explicit reward, thumbs,
    PRM) by `precedence`; the episode reward is not known yet and becomes samples of its own
    (`episode_drafts`). `steps`: the segment's main steps, to aim thumbs at the last answer."""
    explicit, thumbs, _ = _session_signals(steps, events)
    own = [s for s in config.precedence if s != "episode"] or ["prm"]
    drafts: list[Draft] = []
    for judgement in _in_order(judgements):
        step = judgement.turn.step
        signals = Signals(
            explicit=explicit.get(step.step_id),
            feedback=thumbs.get(step.step_id),
            prm=judgement.prm_score,
            sources=source_scores(judgement),
        )
        sample_id = sample_id_of(judgement.judgement_id, config.method, topic)
        draft = _draft(judgement, signals, config, sample_id, own)
        if draft is not None:
            drafts.append(draft)
    return drafts


def _episode_reward(events: list[SessionEvent], config: WorkerSettings) -> float | None:
    """per_turn: the reward a closed segment's episode samples carry, None when it makes none."""
    if config.method == "opd":
        return None  # distillation only: a scalar reward teaches nothing there
    return _session_signals([], events)[2]


def needs_judgements(events: list[SessionEvent], config: WorkerSettings) -> bool:
    """per_turn: whether a closed segment with these events makes episode samples, which need
    its judgements (the turns' own samples left already)."""
    return _episode_reward(events, config) is not None


def episode_drafts(
    judgements: list[Judgement], events: list[SessionEvent], config: WorkerSettings, topic: str
) -> list[Draft]:
    """per_turn, once an episode (segment) closed with every turn judged: when it has an episode
    reward (`/rl/set_reward` with no step), one more sample per turn carrying that reward
    discounted back (gamma), beside the turn's own sample. Its id is derived from the turn's
    judgement, so a reward that arrives after the close still makes each sample once."""
    episode = _episode_reward(events, config)
    if episode is None:
        return []
    judgements = _in_order(judgements)
    rewards = discounted(episode, len(judgements), config.gamma)
    drafts: list[Draft] = []
    for judgement, reward in zip(judgements, rewards, strict=True):
        sample_id = derive_uuid7(judgement.judgement_id, f"sample:episode:{config.method}:{topic}")
        plain = judgement.model_copy(update={"teacher_logprobs": None})
        draft = _draft(plain, Signals(episode=reward), config, sample_id, ["episode"])
        if draft is not None:
            drafts.append(draft)
    return drafts
