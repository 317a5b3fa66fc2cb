"""Rows of different LoRA adapters in one forward of the base model, as vLLM's multi-LoRA
kernels, S-LoRA and Punica do on GPUs: every resident adapter's low-rank weights are stacked
per adapted layer, one slot an adapter, and a forward hook on each adapted linear layer adds
each row's own delta, its slot's A and B gathered by the row (two batched matmuls a layer).
Slot 0 is the base model: zeros.

The engine had run each adapter's rows in a lane of their own, one forward each: 16 adapters
in one batch decoded at 0.12x one adapter's tokens/s (SmolLM2-135M, 2 cores). peft's
mixed-batch forward (`adapter_names=`) loops over the adapters inside every layer instead.

An adapter is read from the folder peft writes (adapter_config.json and adapter_model.
safetensors); its scale (alpha / r, or alpha / sqrt(r) with rsLoRA) is folded into B. Used on
the engine thread only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

PEFT_PREFIX = "base_model.model."
GROW_SLOTS = 8


@dataclass
class _Stack:
    """One adapted layer's weights, slot by slot: a [slots, rank, in], b [slots, out, rank]."""

    a: torch.Tensor
    b: torch.Tensor
    used: set[int] = field(default_factory=set)  # slots whose adapter adapts this layer
    # the rows' gathered A and B, kept from step to step (allocated anew, every decode step
    # faulted in fresh pages for each of the model's adapted layers)
    rows_a: torch.Tensor | None = None
    rows_b: torch.Tensor | None = None

    def gathered(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = rows.shape[0]
        if (
            self.rows_a is None
            or self.rows_b is None
            or self.rows_a.shape[0] < n
            or self.rows_a.shape[1:] != self.a.shape[1:]
        ):
            self.rows_a = self.a.new_empty(n, *self.a.shape[1:])
            self.rows_b = self.b.new_empty(n, *self.b.shape[1:])
        a, b = self.rows_a[:n], self.rows_b[:n]
        torch.index_select(self.a, 0, rows, out=a)
        torch.index_select(self.b, 0, rows, out=b)
        return a, b


def read_adapter(folder: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """An adapter folder as peft writes it: module name -> (A [r, in], scale * B [out, r]).
    ValueError for what this engine cannot serve (DoRA, extra trained modules, patterns)."""
    config = json.loads((folder / "adapter_config.json").read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"not a LoRA adapter: peft_type {config.get('peft_type')}")
    for unsupported in ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern"):
        if config.get(unsupported):
            raise ValueError(f"adapters with {unsupported} are not supported by this engine")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / (math.sqrt(r) if config.get("use_rslora") else r)
    files = sorted(folder.glob("adapter_model*.safetensors"))
    if files:
        weights: dict[str, torch.Tensor] = {}
        for file in files:
            weights.update(load_file(str(file)))
    elif (folder / "adapter_model.bin").is_file():
        weights = torch.load(folder / "adapter_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"no adapter weights in {folder}")
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        module, _, part = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        if part not in ("A.weight", "B.weight"):
            raise ValueError(f"unexpected adapter weight {key}: only LoRA A and B of linear layers")
        layers.setdefault(module, {})[part[0]] = tensor
    out = {}
    for module, pair in layers.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"adapter weight of {module} lacks its A or B")
        out[module] = (pair["A"], pair["B"] * scale)
    return out


class BatchedLora:
    """The stacks and hooks of one model. `load` gives an adapter a slot, `release` frees it;
    `select` says each row's slot before a forward."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._linears: dict[str, nn.Linear] | None = None  # found at the first load
        self.stacks: dict[str, _Stack] = {}
        self.capacity = 1  # slot 0: the base model
        self.free: list[int] = []
        self.single = 0  # the slot of every row, when `rows` is None
        self.rows: torch.Tensor | None = None  # each row's slot, when they differ

    def select(self, slots: Sequence[int]) -> None:
        """The next forwards compute row i with slot slots[i]."""
        first = slots[0]
        if all(s == first for s in slots):
            self.single, self.rows = first, None
        else:
            self.rows = torch.tensor(list(slots), device=self._device())

    @property
    def linears(self) -> dict[str, nn.Linear]:
        if self._linears is None:
            modules = self.model.named_modules()
            self._linears = {n: m for n, m in modules if isinstance(m, nn.Linear)}
        return self._linears

    def load(self, folder: Path) -> int:
        """The adapter at `folder` in a free slot: its number."""
        layers = read_adapter(folder)
        unknown = [m for m in layers if m not in self.linears]
        if unknown:
            raise ValueError(f"the adapter adapts layers the model lacks: {unknown[:3]}")
        slot = self.free.pop() if self.free else self._grow()
        for module, (a, b) in layers.items():
            stack = self.stacks.get(module) or self._new_stack(module)
            rank = a.shape[0]
            if rank > stack.a.shape[1]:
                stack.a = nn.functional.pad(stack.a, (0, 0, 0, rank - stack.a.shape[1]))
                stack.b = nn.functional.pad(stack.b, (0, rank - stack.b.shape[2]))
            stack.a[slot].zero_()
            stack.b[slot].zero_()
            stack.a[slot, :rank] = a.to(stack.a)
            stack.b[slot, :, :rank] = b.to(stack.b)
            stack.used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        for stack in self.stacks.values():
            if slot in stack.used:
                stack.used.discard(slot)
                stack.a[slot].zero_()
                stack.b[slot].zero_()
        self.free.append(slot)

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _grow(self) -> int:
        # by GROW_SLOTS: doubling had left up to half the stacks unused (SmolLM2-135M, rank 16
        # on the attention projections: 7 MiB a slot)
        slot, self.capacity = self.capacity, self.capacity + GROW_SLOTS
        for stack in self.stacks.values():
            more = self.capacity - stack.a.shape[0]
            stack.a = torch.cat([stack.a, stack.a.new_zeros(more, *stack.a.shape[1:])])
            stack.b = torch.cat([stack.b, stack.b.new_zeros(more, *stack.b.shape[1:])])
        self.free.extend(range(self.capacity - 1, slot, -1))
        return slot

    def _new_stack(self, module: str) -> _Stack:
        linear = self.linears[module]
        weight = linear.weight
        out_features, in_features = weight.shape
        stack = _Stack(
            a=weight.new_zeros(self.capacity, 1, in_features),
            b=weight.new_zeros(self.capacity, out_features, 1),
        )
        self.stacks[module] = stack
        linear.register_forward_hook(self._hook(stack))
        return stack

    def _hook(self, stack: _Stack) -> Any:
        def add_delta(
            _module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor
        ) -> torch.Tensor | None:
            x = args[0]
            if self.rows is None:
                slot = self.single
                if slot not in stack.used:
                    return None
                return output + (x @ stack.a[slot].mT) @ stack.b[slot].mT
            a, b = stack.gathered(self.rows)  # [rows, r, in], [rows, out, r]
            return output + torch.bmm(torch.bmm(x, a.mT), b.mT)

        return add_delta
