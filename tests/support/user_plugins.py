"""Plugins as a user writes them (docs/extending/): reward rules and a custom loss. The tests
name them by import path, `tests.support.user_plugins:<name>`, as a config would."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from claw_stream.events import Turn
from claw_stream.trainer.config import LossConfig
from claw_stream.trainer.losses import policy_loss

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def exact_answer(turn: Turn, metadata: Mapping[str, Any]) -> tuple[float, str] | None:
    """A math task: 1 when the answer's last number is the session's expected `answer`,
    -1 when it is another; no opinion in a session that passed no ground truth."""
    expected = metadata.get("answer")
    if expected is None:
        return None
    numbers = _NUMBER.findall(turn.step.response.message.content or "")
    if not numbers:
        return -1.0, "no number in the answer"
    got = numbers[-1]
    return (1.0, f"{got} is right") if got == str(expected) else (-1.0, f"{got}, not {expected}")


async def short_answer(turn: Turn, metadata: Mapping[str, Any]) -> float:
    """An async rule: answers of at most 3 tokens are good, longer ones bad."""
    return 1.0 if len(turn.step.response_token_ids) <= 3 else -1.0


def raises(turn: Turn, metadata: Mapping[str, Any]) -> float:
    raise ValueError("this rule always fails")


def plain_pg_loss(
    config: LossConfig,
    new: torch.Tensor,
    old: torch.Tensor,
    behaviour: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    ref: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE without clipping or importance weights, reporting its mean advantage and the
    built-in PPO loss on the same batch for comparison."""
    mask = mask.to(new.dtype)
    per_sample = -(new * advantage.detach() * mask).sum(1) / mask.sum(1).clamp(min=1)
    ppo = policy_loss(config, new.detach(), old, behaviour, advantage, mask).loss
    mean_advantage = float((advantage * mask).sum() / mask.sum().clamp(min=1))
    return per_sample.mean(), {"mean_advantage": mean_advantage, "ppo_loss": float(ppo)}
