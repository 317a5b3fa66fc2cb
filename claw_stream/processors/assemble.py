"""A closed session's judgements and signals become samples: reward, method, learning signal.

Pure: the worker calls it on what Postgres holds for a session, replay on what it re-derived.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from claw_stream.events import Judgement, Sample, SessionEvent
from claw_stream.ids import derive_uuid7
from claw_stream.processors.config import PipelineConfig
from claw_stream.processors.rewards import Signals, discounted, has_signal, step_reward


@dataclass(frozen=True)
class Draft:
    """A sample before release: `released_at_version` is set when it is released."""

    sample: Sample
    has_signal: bool


def sample_id_of(judgement_id: uuid.UUID, method: str, topic: str) -> uuid.UUID:
    return derive_uuid7(judgement_id, f"sample:{method}:{topic}")


def _session_signals(
    judgements: list[Judgement], events: list[SessionEvent]
) -> tuple[dict[uuid.UUID, float], dict[uuid.UUID, int], float | None]:
    """Per-step explicit rewards, per-step thumbs and the episode reward (the latest wins)."""
    explicit: dict[uuid.UUID, float] = {}
    thumbs: dict[uuid.UUID, int] = {}
    episode: float | None = None
    steps = [j.turn.step for j in judgements]
    for event in sorted(events, key=lambda e: (e.created_at, e.event_id)):
        if event.kind == "reward" and event.reward is not None:
            if event.step_id is None:
                episode = event.reward
            else:
                explicit[event.step_id] = event.reward
        elif event.kind == "feedback" and event.score is not None:
            target = event.step_id
            if target is None:  # thumbs on "the last answer": the latest step before it
                before = [s for s in steps if s.created_at <= event.created_at] or steps
                target = before[-1].step_id if before else None
            if target is not None:
                thumbs[target] = event.score
    return explicit, thumbs, episode


def assemble_session(
    judgements: list[Judgement], events: list[SessionEvent], config: PipelineConfig, topic: str
) -> list[Draft]:
    """One draft per judged turn, in turn order."""
    judgements = sorted(judgements, key=lambda j: (j.turn.step.turn_index, j.turn.step.created_at))
    explicit, thumbs, episode = _session_signals(judgements, events)
    episode_rewards = (
        discounted(episode, len(judgements), config.gamma) if episode is not None else None
    )
    drafts: list[Draft] = []
    for k, judgement in enumerate(judgements):
        step = judgement.turn.step
        if not step.response_token_ids:
            continue  # an empty answer has no token to learn from
        signals = Signals(
            explicit=explicit.get(step.step_id),
            feedback=thumbs.get(step.step_id),
            episode=episode_rewards[k] if episode_rewards else None,
            prm=judgement.prm_score,
        )
        reward, source = step_reward(signals, config.precedence, config.reward_rule)
        teacher = judgement.teacher_logprobs if config.method != "binary" else None
        signal = has_signal(config.method, reward, teacher is not None)
        if config.method != "binary" and teacher is None:
            # no accepted hint: the teacher agrees with the behaviour policy, so the sample
            # adds no distillation term (batches stay homogeneous for the trainer)
            teacher = step.response_logprobs
        sample = Sample(
            sample_id=sample_id_of(judgement.judgement_id, config.method, topic),
            session_id=step.session_id,
            group_id=step.group_id,
            step_id=step.step_id,
            turn_id=judgement.turn.turn_id,
            method=config.method,
            prompt_token_ids=step.prompt_token_ids,
            response_token_ids=step.response_token_ids,
            response_logprobs=step.response_logprobs,
            teacher_logprobs=teacher,
            reward=reward,
            reward_source=source,
            weight_version=step.weight_version,
            released_at_version=step.weight_version,
        )
        drafts.append(Draft(sample, signal))
    if config.at_least_one_per_session and drafts and not any(d.has_signal for d in drafts):
        drafts[-1] = Draft(drafts[-1].sample, True)  # the session's one sample, even at zero
    return drafts
