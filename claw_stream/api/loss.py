"""Loss: the per-token policy loss the trainer optimises.

A user writes a `LossFunction` with the signature of `claw_stream.trainer.losses.policy_loss`,
named by `trainer.loss` (`module:function`, or an entry point of the group
`claw_stream.losses`). The trainer calls it once per micro-batch with the `LossConfig` and
`[batch, tokens]` tensors, positionally. Docs: docs/extending/loss.md.

Free of torch at run time (it is named for the type checker only), so the settings and the
CLI that import this stay light.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

from claw_stream.names import Method

if TYPE_CHECKING:
    import torch

__all__ = [
    "LOSS_ARGUMENTS",
    "LossConfig",
    "LossFunction",
    "LossOutput",
    "LossResult",
    "Normalisation",
]

Normalisation = Literal["none", "group", "batch"]


@dataclass(frozen=True)
class LossConfig:
    """What the per-token loss needs (`trainer/losses.py`)."""

    method: Method = "binary"
    eps_low: float = 0.2
    eps_high: float = 0.28
    is_cap: float = 2.0  # C of the truncated importance weight
    w_opd: float = 1.0
    w_rl: float = 1.0
    kl_coef: float = 0.0
    normalise: Normalisation = "none"


@dataclass
class LossOutput:
    loss: torch.Tensor
    clip_fraction: float = 0.0
    approx_kl: float = 0.0
    is_weight_mean: float = 1.0
    is_weight_max: float = 1.0
    kl_ref: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # a user loss's own figures


# a scalar loss, (loss, {metric: number}) or a LossOutput
LossResult: TypeAlias = "LossOutput | torch.Tensor | tuple[torch.Tensor, Mapping[str, float]]"
LOSS_ARGUMENTS = ("config", "new", "old", "behaviour", "advantage", "mask", "ref")


class LossFunction(Protocol):
    """`new` carries the gradient; `old`, `behaviour` (the engine's when it sampled) and
    `advantage` do not; `mask` is 1 for the trained answer tokens; `ref` the reference
    log-probs when `kl_coef` > 0, else None."""

    def __call__(
        self,
        config: LossConfig,
        new: torch.Tensor,
        old: torch.Tensor,
        behaviour: torch.Tensor,
        advantage: torch.Tensor,
        mask: torch.Tensor,
        ref: torch.Tensor | None = None,
        /,
    ) -> LossResult: ...
