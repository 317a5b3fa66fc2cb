"""The model side of the trainer: a DeepSpeed engine, one optimizer step per batch, checkpoints.

On CPU DeepSpeed runs with DS_ACCELERATOR=cpu, the gloo backend, ZeRO-1 and torch's AdamW (seen
working on the project's machines); on GPUs with NCCL, bf16 and ZeRO 2/3 under the deepspeed
launcher, which sets RANK / WORLD_SIZE itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from claw_stream.events import Sample
from claw_stream.trainer.batching import (
    MicroBatch,
    collate,
    micro_batches,
    pack_samples,
    position_ids,
    token_logprobs,
)
from claw_stream.trainer.config import TrainerSettings
from claw_stream.trainer.losses import (
    advantages,
    as_loss_output,
    load_loss,
    normalise_rewards,
)
from claw_stream.versions.checkpoints import prunable

STATE_FILE = "trainer_state.json"


def init_distributed(device: str) -> Any:
    """Single-process defaults (the deepspeed launcher overrides them), then DeepSpeed itself."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
    }.items():
        os.environ.setdefault(key, value)
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(
            dist_backend="gloo" if device == "cpu" else "nccl", verbose=False
        )
    return deepspeed


@dataclass
class StepMetrics:
    loss: float
    n_samples: int
    n_tokens: int
    mean_reward: float
    clip_fraction: float
    approx_kl: float
    is_weight_mean: float
    is_weight_max: float
    step_time_s: float
    kl_ref: float = 0.0
    n_trained: int = 0  # answer tokens trained
    n_unpacked: int = 0  # samples that could not join their session's sequence
    extra: dict[str, float] = field(default_factory=dict)  # a user loss's metrics
    n_groups: int = 0  # groups of several trajectories whose rewards were normalised together

    @property
    def tokens_per_trained(self) -> float:
        """Tokens processed per answer token trained (packing lowers it)."""
        return self.n_tokens / self.n_trained if self.n_trained else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.step_time_s if self.step_time_s > 0 else 0.0


@dataclass
class TrainerState:
    version: int = 0  # the policy version the weights are (0: the initial model)
    step: int = 0
    offsets: dict[str, int] | None = None  # "topic:partition" -> next offset to read
    seen: list[str] | None = None  # sample ids trained recently (dedupe across redelivery)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)

    @classmethod
    def load(cls, folder: Path) -> TrainerState:
        return cls(**json.loads((folder / STATE_FILE).read_text()))


def _logits(model: Any, batch: MicroBatch) -> torch.Tensor:
    return model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids(batch.attention_mask),
        logits_to_keep=batch.logits_to_keep,
    ).logits


def ranks() -> tuple[int, int]:
    """This process's rank and the number of ranks (0, 1 outside a distributed launch)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def shard(samples: list[Sample], rank: int, world: int) -> list[Sample]:
    """This rank's share of a batch: every world-th sample. A batch smaller than the number of
    ranks lends its samples round (every rank must take part in the step's collectives)."""
    if world == 1:
        return samples
    if len(samples) >= world:
        return samples[rank::world]
    return [samples[rank % len(samples)]]


def n_groups(samples: list[Sample]) -> int:
    """Groups with more than one trajectory (session) in a batch."""
    sessions: dict[str, set[str]] = {}
    for s in samples:
        if s.group_id is not None:
            sessions.setdefault(s.group_id, set()).add(s.session_id)
    return sum(len(members) > 1 for members in sessions.values())


def latest_checkpoint(directory: Path) -> Path | None:
    found = [p for p in directory.glob("v*") if (p / STATE_FILE).is_file()]
    return max(found, key=lambda p: TrainerState.load(p).version, default=None)


class PolicyTrainer:
    distributed = True  # each rank trains its share of a batch (False: this rank the whole)

    def __init__(self, model_path: Path, config: TrainerSettings, *, resume: Path | None = None):
        self.config = config
        # a user loss is imported first: a bad one fails before the model loads
        self.loss_fn = load_loss(config.loss)
        self.deepspeed = init_distributed(config.device)
        dtype = torch.bfloat16 if config.bf16 else torch.float32
        self.base_path = model_path
        self.state = TrainerState()
        source = model_path
        if resume is not None:
            self.state = TrainerState.load(resume)
            source = resume if not config.lora else model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        if config.lora:
            from peft import LoraConfig, PeftModel, get_peft_model

            if resume is not None:
                model = PeftModel.from_pretrained(model, resume, is_trainable=True)
            else:
                model = get_peft_model(
                    model,
                    LoraConfig(
                        r=config.lora_r,
                        lora_alpha=config.lora_alpha,
                        target_modules=config.lora_targets,
                    ),
                )
        model.config.use_cache = False
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.engine, self.optimizer, _, _ = self.deepspeed.initialize(
            model=model, optimizer=optimizer, config=config.deepspeed_config()
        )
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.loss_config = config.loss_config()
        # the KL anchor: the initial model (with LoRA, the base under the adapter, for free)
        self.reference: torch.nn.Module | None = None
        if config.kl_coef > 0 and not config.lora:
            reference: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
            self.reference = reference.to(self.device).eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def train_step(self, samples: list[Sample]) -> StepMetrics:
        """One optimizer step over the samples, micro-batched by the token budget.

        With several ranks every rank gets the whole batch and trains its share of it (rewards
        are normalised over the whole batch first, so groups split across ranks keep their
        baseline); each rank takes the mean over its share and DeepSpeed averages the ranks'
        gradients: the mean over the batch."""
        started = time.perf_counter()
        self.engine.train()
        rank, world = ranks() if self.distributed else (0, 1)
        rewards = normalise_rewards(
            torch.tensor([s.reward for s in samples]),
            [s.group_id for s in samples],
            self.config.normalise,
        )
        reward_of = {s.sample_id: float(r) for s, r in zip(samples, rewards, strict=True)}
        mine = shard(samples, rank, world)
        packs, unpacked = pack_samples(
            mine, enabled=self.config.pack, max_tokens=self.config.max_sequence_tokens
        )
        groups = list(micro_batches(packs, self.config.micro_batch_tokens))
        keys = ("loss", "clip", "kl", "kl_ref", "w_mean", "w_max", "tokens", "trained")
        totals = dict.fromkeys(keys, 0.0)
        extra: dict[str, float] = {}  # a user loss's metrics, per-sample means like the loss
        for i, group in enumerate(groups):
            members = [s for p in group for s in p.members]
            batch = collate(group, self.pad_id, rewards=[reward_of[s.sample_id] for s in members])
            batch = batch.to(self.device)
            new = token_logprobs(_logits(self.engine, batch), batch)
            # one optimizer step per batch: the policy at the start of the update is this one
            old = new.detach()
            adv = advantages(self.loss_config, batch.rewards, old, batch.teacher)
            ref = self._reference_logprobs(batch) if self.config.kl_coef > 0 else None
            behaviour = batch.behaviour
            if batch.without_skills is not None and bool(batch.without_skills.any()):
                # sampled with skills this prompt lacks: the answer is the lesson, not an older
                # policy's sample, so no importance weight (exp(old - behaviour) would all but
                # silence the tokens the skills made likely, the ones to learn)
                behaviour = torch.where(batch.without_skills[:, None], old, behaviour)
            out = as_loss_output(
                self.loss_fn(self.loss_config, new, old, behaviour, adv, batch.mask, ref),
                self.config.loss or "policy_loss",
            )
            for k, v in out.metrics.items():
                extra[k] = extra.get(k, 0.0) + v * len(members) / len(mine)
            share = len(members) / len(mine)  # per-sample mean: ranks' means are averaged
            self.engine.set_gradient_accumulation_boundary(i == len(groups) - 1)
            self.engine.backward(out.loss * share)
            totals["loss"] += out.loss.item() * share
            totals["clip"] += out.clip_fraction * share
            totals["kl"] += out.approx_kl * share
            totals["kl_ref"] += out.kl_ref * share
            totals["w_mean"] += out.is_weight_mean * share
            totals["w_max"] = max(totals["w_max"], out.is_weight_max)
            totals["tokens"] += batch.n_tokens
            totals["trained"] += batch.n_trained
        self.engine.step()
        self.state.step += 1
        if world > 1:  # the whole batch's figures, not this rank's share
            summed = torch.tensor(
                [totals[k] for k in ("loss", "clip", "kl", "kl_ref", "w_mean", "tokens")]
                + [totals["trained"], float(unpacked)],
                dtype=torch.float64,
            )
            torch.distributed.all_reduce(summed)
            for k, value in zip(
                ("loss", "clip", "kl", "kl_ref", "w_mean"), summed.tolist(), strict=False
            ):
                totals[k] = value / world
            totals["tokens"] = float(summed[5])
            totals["trained"] = float(summed[6])
            unpacked = int(summed[7])
            peak = torch.tensor([totals["w_max"]], dtype=torch.float64)
            torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
            totals["w_max"] = float(peak[0])
        return StepMetrics(
            loss=totals["loss"],
            n_samples=len(samples),
            n_tokens=int(totals["tokens"]),
            mean_reward=float(torch.tensor([s.reward for s in samples]).mean()),
            clip_fraction=totals["clip"],
            approx_kl=totals["kl"],
            is_weight_mean=totals["w_mean"],
            is_weight_max=totals["w_max"],
            step_time_s=time.perf_counter() - started,
            kl_ref=totals["kl_ref"],
            n_trained=int(totals["trained"]),
            n_unpacked=unpacked,
            extra=extra,
            n_groups=n_groups(samples) if self.config.normalise == "group" else 0,
        )

    @torch.no_grad()
    def _reference_logprobs(self, batch: MicroBatch) -> torch.Tensor:
        if self.reference is not None:
            return token_logprobs(_logits(self.reference, batch), batch)
        with self.engine.module.disable_adapter():  # LoRA: the base model is the reference
            return token_logprobs(_logits(self.engine, batch), batch)

    def weights_digest(self) -> str:
        """SHA-256 of the trainable weights: equal on every rank after every step."""
        digest = hashlib.sha256()
        for name, param in self.engine.module.named_parameters():
            if param.requires_grad:
                digest.update(name.encode())
                digest.update(param.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()

    def save(self, directory: Path, version: int, offsets: dict[str, int], seen: list[str]) -> Path:
        """Write checkpoint `v{version}` atomically: weights (or adapter), tokenizer, state."""
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"v{version}"
        staging = directory / f".v{version}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        self._save_weights(staging)
        self.tokenizer.save_pretrained(staging)
        self.state.version, self.state.offsets, self.state.seen = version, offsets, seen[-10_000:]
        (staging / STATE_FILE).write_text(self.state.to_json())
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        return final

    def _save_weights(self, folder: Path) -> None:
        module = self.engine.module
        # ZeRO-3 keeps each parameter partitioned, the module holding empty placeholders: saved
        # as it stands, the checkpoint had empty tensors (lm_head.weight, seen in
        # bench/gpu_trainer_check.py) that no engine can load. Gathered, it is whole.
        gathered = (
            self.deepspeed.zero.GatheredParameters(list(module.parameters()))
            if self.config.zero_stage == 3
            else contextlib.nullcontext()
        )
        with gathered:
            module.save_pretrained(folder, safe_serialization=True)

    def go_back_to(self, folder: Path, version: int) -> None:
        """Go on training from checkpoint `folder` (a rejection or a rollback). The module's
        weights are replaced in place and ZeRO's fp32 copy is refreshed from them. The
        optimizer's moments are cleared, as a trainer restarted from a checkpoint has them (no
        optimizer state is checkpointed): kept, the momentum of the abandoned weights would
        push the first steps on the way they went."""
        if self.config.zero_stage == 3:
            raise NotImplementedError("going back to a version needs ZeRO <= 2")
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(file)))
        if not state:
            raise FileNotFoundError(f"no safetensors files in {folder}")
        module = self.engine.module
        with torch.no_grad():
            if self.config.lora:  # the adapter's weights (an adapter folder, as peft wrote it)
                from peft import set_peft_model_state_dict

                set_peft_model_state_dict(module, state)
            else:
                module.load_state_dict(state, strict=False)
                if getattr(module.config, "tie_word_embeddings", False):
                    module.tie_weights()
        optimizer = self.engine.optimizer
        refresh = getattr(optimizer, "refresh_fp32_params", None)
        if refresh is not None:
            refresh()
        inner = getattr(optimizer, "optimizer", optimizer)  # ZeRO wraps the torch optimizer
        if isinstance(inner, torch.optim.Optimizer):
            inner.state.clear()
        self.state.version = version

    def prune(self, directory: Path, keep: int, protected: set[int] | None = None) -> None:
        """All but the newest `keep` checkpoints and the protected versions' go."""
        folders = {
            TrainerState.load(p).version: p
            for p in directory.glob("v*")
            if (p / STATE_FILE).is_file()
        }
        for version in prunable(list(folders), keep, protected or set()):
            shutil.rmtree(folders[version], ignore_errors=True)
