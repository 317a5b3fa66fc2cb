"""Tenants' adapters over one base model in memory: peft's named adapters in one `PeftModel`,
each stepped by an optimizer of its own (`AdapterTrainer`), so what a tenant adds is its
adapter, its gradients and its optimizer moments (`bench/tenants_bench.py` measures it).

Each tenant had had a DeepSpeed engine over a copy of the base model of its own (520 MiB of
weights a tenant, SmolLM2-135M in fp32). DeepSpeed's engine owns its module and one optimizer
over it, so many adapters on one module are stepped here by torch's AdamW, with DeepSpeed's
gradient clipping (`trainer.gradient_clipping`); the loss and its micro-batches are
`PolicyTrainer`'s.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from claw_stream.trainer.config import TrainerSettings
from claw_stream.trainer.losses import load_loss
from claw_stream.trainer.policy import PolicyTrainer, TrainerState

# A placeholder adapter the model keeps, so that removing the last tenant's leaves a PeftModel.
IDLE = "_idle"


class SharedBase:
    """One frozen base model carrying every tenant's adapter by name."""

    def __init__(self, model_path: Path, config: TrainerSettings):
        from peft import LoraConfig, get_peft_model

        self.config = config
        dtype = torch.bfloat16 if config.bf16 else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        base: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        base.config.use_cache = False
        self.lora = LoraConfig(
            r=config.lora_r, lora_alpha=config.lora_alpha, target_modules=config.lora_targets
        )
        device = "cuda" if config.device.startswith("cuda") else config.device
        self.model: Any = get_peft_model(base, self.lora, adapter_name=IDLE).to(device)
        self.device = torch.device(device)

    def add(self, name: str, resume: Path | None) -> list[torch.nn.Parameter]:
        """Adapter `name`, new or from its checkpoint: its trainable parameters."""
        if resume is not None:
            self.model.load_adapter(str(resume), adapter_name=name, is_trainable=True)
        else:
            self.model.add_adapter(name, self.lora)
        return self.parameters(name)

    def parameters(self, name: str) -> list[torch.nn.Parameter]:
        tag = f".{name}."
        return [p for n, p in self.model.named_parameters() if tag in n and "lora_" in n]

    def remove(self, name: str) -> None:
        self.model.set_adapter(IDLE)
        self.model.delete_adapter(name)

    def use(self, name: str) -> None:
        """The model computes with (and trains) adapter `name` alone."""
        self.model.set_adapter(name)

    def save(self, name: str, folder: Path) -> None:
        """Adapter `name` as peft writes an adapter of its own (the folder the engines load)."""
        self.model.save_pretrained(folder, selected_adapters=[name], safe_serialization=True)
        nested = folder / name  # peft puts an adapter not named "default" in a subfolder
        for file in nested.iterdir():
            file.rename(folder / file.name)
        shutil.rmtree(nested)


class _AdapterEngine:
    """What `PolicyTrainer.train_step` asks of DeepSpeed's engine, for one adapter of a shared
    base: forward with that adapter, backward, clip, step its own optimizer."""

    def __init__(self, base: SharedBase, name: str, params: list[torch.nn.Parameter]):
        self.base = base
        self.name = name
        self.module = base.model
        self.device = base.device
        self.params = params
        config = base.config
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)

    def train(self) -> None:
        self.base.use(self.name)
        self.module.train()

    def __call__(self, **inputs: Any) -> Any:
        self.base.use(self.name)
        return self.module(**inputs)

    def set_gradient_accumulation_boundary(self, _boundary: bool) -> None:
        """Gradients accumulate over the micro-batches until `step`."""

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        clip = self.base.config.gradient_clipping
        if clip:
            torch.nn.utils.clip_grad_norm_(self.params, clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class AdapterTrainer(PolicyTrainer):
    """A tenant's adapter on the shared base: `PolicyTrainer`'s steps, checkpoints and pruning.
    With several ranks, rank 0 alone holds the base and trains tenants' adapters (each step is
    a few of one tenant's samples), while every rank trains the shared policy."""

    distributed = False

    def __init__(self, base: SharedBase, name: str, *, resume: Path | None = None):
        self.config = base.config
        self.loss_fn = load_loss(self.config.loss)
        self.base_path = Path(base.model.base_model.model.name_or_path)
        self.state = TrainerState.load(resume) if resume is not None else TrainerState()
        self.tokenizer = base.tokenizer
        self.shared = base
        self.name = name
        self.engine = _AdapterEngine(base, name, base.add(name, resume))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.loss_config = self.config.loss_config()
        self.reference = None  # the base under the adapter is the KL anchor

    @property
    def device(self) -> torch.device:
        return self.shared.device

    def _save_weights(self, folder: Path) -> None:
        self.shared.save(self.name, folder)

    def weights_digest(self) -> str:
        self.shared.use(self.name)
        return super().weights_digest()
