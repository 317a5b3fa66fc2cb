"""Trainer configuration: one section (`trainer:` in YAML, CLAW_TRAINER__*) beside the trainer.

Kept free of torch, so the settings (and every command that loads them) start fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from claw_stream.names import Method

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


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Method = "binary"
    samples_topic: str | None = Field(
        default=None,
        description="Default: the samples topic of `topics:`; a replay's topic to learn from it.",
    )
    group_id: str = "claw-trainer"
    init_from: Path | None = Field(default=None, description="A checkpoint folder to start from.")
    checkpoint_dir: Path | None = Field(default=None, description="Default DATA_DIR/checkpoints.")
    keep_checkpoints: int = Field(default=3, ge=1)
    engines: list[str] = Field(
        default_factory=list, description="Engines to push to; default: the engine."
    )

    batch_size: int = Field(default=8, ge=1, description="Samples per optimizer step.")
    micro_batch_tokens: int = Field(default=4096, ge=16, description="Padded tokens per forward.")
    pack: bool = Field(
        default=True,
        description="Train a session's turns whose prompts extend one another in one sequence "
        "(one forward pass over the conversation instead of one per turn).",
    )
    max_sequence_tokens: int = Field(
        default=32_768,
        ge=16,
        description="A packed sequence grows no longer: the session is split at a turn "
        "boundary (an answer is never cut).",
    )
    max_wait_s: float = Field(
        default=5.0, gt=0, description="Train a partial batch after this long."
    )
    push_every: int = Field(default=1, ge=1, description="Steps between checkpoint + push.")
    engine_check_s: float = Field(
        default=10.0,
        ge=0,
        description="How often each engine is asked whether it serves the serving version "
        "(an engine that restarted serves the model it started with); one that does not gets it "
        "again. 0: never.",
    )
    check_ranks_every: int = Field(
        default=0,
        ge=0,
        description="With several ranks: print each rank's weights digest every N steps "
        "(they must agree); 0: never.",
    )
    lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    gradient_clipping: float = Field(default=1.0, ge=0)

    eps_low: float = 0.2
    eps_high: float = 0.28
    is_cap: float = Field(default=2.0, ge=1.0)
    w_opd: float = 1.0
    w_rl: float = 1.0
    kl_coef: float = Field(default=0.0, ge=0)
    normalise: Normalisation = Field(
        default="group",
        description="group: a group (samples sharing a group_id, e.g. a task's G attempts) with "
        "more than one trajectory trains on its rewards normalised within it (GRPO); samples "
        "with no group keep their reward. batch: over the whole batch. none: the raw reward.",
    )
    group_size: int | None = Field(
        default=None,
        ge=1,
        description="Hold a group's samples until this many of its sessions sent one (the G of "
        "`claw-stream tasks run`), so the group trains in one step; None: no waiting.",
    )
    skip_flat_groups: bool = Field(
        default=True,
        description="Under group normalisation, don't train a group whose rewards are all "
        "equal (every advantage zero): its samples are recorded as zero_advantage and the "
        "batch waits for groups with signal (DAPO's dynamic sampling).",
    )
    group_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="A group still incomplete this long after its first sample trains as it is.",
    )
    loss: str | None = Field(
        default=None,
        description="A user loss in place of the built-in PPO loss: module:function or an "
        "entry point of claw_stream.losses, with the signature of losses.policy_loss; the "
        "metrics it returns go to the log and to training_steps.extra (docs/plugins.md).",
    )

    lora: bool = False
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )

    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(
        default=9400, ge=1, le=65535, description="Prometheus; None: off."
    )

    zero_stage: Literal[0, 1, 2, 3] = 1
    bf16: bool = False
    device: str = Field(default="cpu", description="cpu (gloo) or cuda (nccl)")

    def loss_config(self) -> LossConfig:
        return LossConfig(
            method=self.method,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            is_cap=self.is_cap,
            w_opd=self.w_opd,
            w_rl=self.w_rl,
            kl_coef=self.kl_coef,
            normalise=self.normalise,
        )

    def deepspeed_config(self) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": self.gradient_clipping,
            "zero_optimization": {"stage": self.zero_stage},
            "bf16": {"enabled": self.bf16},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
