"""Per-token policy losses of the trainer (docs/architecture.md, Trainer); the built-in
`claw_stream.api.LossFunction`, which `trainer.loss` replaces (docs/extending/loss.md).

Notation, per response token t of a sample:
  new_t   log π_θ(token)                 (with gradient)
  old_t   log π_old(token)               the policy at the start of this update (no gradient)
  behav_t log π_behaviour(token)         what the engine sampled with (the Step's logprobs)
  teach_t log π_teacher(token)           OPD teacher: same tokens, prompt with the hint

  ratio_t = exp(new_t - old_t), clipped to [1 - ε_low, 1 + ε_high]           (PPO, decoupled)
  w_t     = min(exp(old_t - behav_t), C)  truncated importance weight: live samples come from
                                          older policy versions than the one being trained
          = 1                             a sample distilled from skills (`without_skills`:
                                          its answer was sampled with a prompt it lacks;
                                          the trainer passes old as its behaviour)
  A_t     = reward                        binary (or its group / batch normalisation)
          = teach_t - old_t               opd
          = w_opd·(teach_t - old_t) + w_rl·reward                                 combine
  loss_t  = -w_t · min(ratio_t·A_t, clip(ratio_t)·A_t)  [+ β·KL_t to a reference, k3 estimator]

A sample's loss is the mean over its response tokens that the mask keeps (prompt and tool
tokens never count); the batch loss is the mean over samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from claw_stream.api.loss import LossConfig, LossFunction, LossOutput, Normalisation
from claw_stream.plugins import PluginError, load_loss_function


def load_loss(spec: str | None) -> LossFunction:
    """`trainer.loss`: the built-in PPO loss (None), or a user's function by `module:function`
    or entry point name (group claw_stream.losses), with `policy_loss`'s signature."""
    if spec is None:
        return policy_loss
    return load_loss_function(spec, f"trainer.loss ({spec})")


def as_loss_output(value: Any, name: str) -> LossOutput:
    """What a loss function returned, as a LossOutput: a LossOutput, a scalar tensor, or a
    (tensor, {metric: number}) pair; PluginError otherwise, naming the loss."""
    metrics: Mapping[str, Any] = {}
    if isinstance(value, LossOutput):
        out = value
    else:
        if isinstance(value, tuple) and len(value) == 2:
            value, metrics = value
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise PluginError(
                f"trainer.loss ({name}) returned {type(value).__name__}: it must return a "
                "scalar tensor, (tensor, metrics) or a LossOutput"
            )
        out = LossOutput(loss=value.reshape(()))
    if not isinstance(metrics, Mapping):
        raise PluginError(f"trainer.loss ({name}) returned metrics that are not a mapping")
    merged = {**out.metrics, **metrics}
    try:
        out.metrics = {str(k): float(v) for k, v in merged.items()}
    except (TypeError, ValueError) as exc:
        raise PluginError(
            f"trainer.loss ({name}) returned a metric that is no number: {exc}"
        ) from None
    out.metrics = {k: v for k, v in out.metrics.items() if math.isfinite(v)}
    return out


def normalise_rewards(
    rewards: torch.Tensor, groups: list[str | None], how: Normalisation, eps: float = 1e-6
) -> torch.Tensor:
    """Group normalisation where a group has more than one trajectory, else batch or none."""
    if how == "none":
        return rewards
    if how == "batch":
        if rewards.numel() < 2:
            return rewards - rewards.mean()
        return (rewards - rewards.mean()) / (rewards.std() + eps)
    out = rewards.clone()
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g is not None:
            members.setdefault(g, []).append(i)
    for idx in members.values():
        if len(idx) > 1:
            r = rewards[idx]
            out[idx] = (r - r.mean()) / (r.std() + eps)
    return out


def advantages(
    config: LossConfig,
    rewards: torch.Tensor,  # [B]
    old: torch.Tensor,  # [B, T]
    teacher: torch.Tensor | None,  # [B, T]
) -> torch.Tensor:
    reward_t = rewards[:, None].expand_as(old)
    if config.method == "binary":
        return reward_t
    if teacher is None:
        raise ValueError(f"method {config.method!r} needs teacher logprobs")
    distill = teacher - old
    if config.method == "opd":
        return distill
    return config.w_opd * distill + config.w_rl * reward_t


def policy_loss(
    config: LossConfig,
    new: torch.Tensor,  # [B, T] log π_θ, with gradient
    old: torch.Tensor,  # [B, T]
    behaviour: torch.Tensor,  # [B, T]
    advantage: torch.Tensor,  # [B, T]
    mask: torch.Tensor,  # [B, T] 1 for trained response tokens
    ref: torch.Tensor | None = None,  # [B, T] log π_ref, for the KL penalty
) -> LossOutput:
    mask = mask.to(new.dtype)
    old, behaviour, advantage = old.detach(), behaviour.detach(), advantage.detach()
    log_ratio = new - old
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
    surrogate = torch.minimum(ratio * advantage, clipped * advantage)
    weight = torch.clamp(torch.exp(old - behaviour), max=config.is_cap)
    per_token = -weight * surrogate
    kl_value = torch.zeros((), dtype=new.dtype)
    if ref is not None and config.kl_coef > 0:
        # k3 estimator of KL(π_θ || π_ref): exp(ref - new) - (ref - new) - 1, always ≥ 0
        diff = ref.detach() - new
        kl = torch.exp(diff) - diff - 1
        per_token = per_token + config.kl_coef * kl
        kl_value = _masked_mean(kl.detach(), mask)
    tokens = mask.sum(dim=1).clamp(min=1)
    per_sample = (per_token * mask).sum(dim=1) / tokens
    has_tokens = mask.sum(dim=1) > 0
    loss = per_sample[has_tokens].mean() if has_tokens.any() else per_sample.sum() * 0
    with torch.no_grad():
        was_clipped = (
            (ratio * advantage) != torch.minimum(ratio * advantage, clipped * advantage)
        ).to(new.dtype)
        valid = mask.bool()
        return LossOutput(
            loss=loss,
            clip_fraction=float(_masked_mean(was_clipped, mask)),
            approx_kl=float(_masked_mean(0.5 * log_ratio.detach() ** 2, mask)),
            is_weight_mean=float(weight[valid].mean()) if valid.any() else 1.0,
            is_weight_max=float(weight[valid].max()) if valid.any() else 1.0,
            kl_ref=float(kl_value),
        )


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)
