"""Rows of different LoRA adapters in one forward: each row gets its own adapter's delta (ranks,
scales and adapted layers differing), the base rows none; slots are reused and grow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from claw_stream.engine.batched_lora import GROW_SLOTS, BatchedLora, read_adapter


class Toy(nn.Module):
    """Two linear layers named as a decoder's are."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.q_proj = nn.Linear(6, 4)  # type: ignore[assignment]
        self.model.down_proj = nn.Linear(4, 3)  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.down_proj(self.model.q_proj(x))  # type: ignore[operator]


def write_adapter(
    folder: Path, rank: int, alpha: int, layers: dict[str, tuple[int, int]], seed: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A peft-style adapter folder; returns each layer's (A, B)."""
    gen = torch.Generator().manual_seed(seed)
    weights, pairs = {}, {}
    for name, (n_in, n_out) in layers.items():
        a, b = torch.randn(rank, n_in, generator=gen), torch.randn(n_out, rank, generator=gen)
        weights[f"base_model.model.model.{name}.lora_A.weight"] = a
        weights[f"base_model.model.model.{name}.lora_B.weight"] = b
        pairs[f"model.{name}"] = (a, b)
    folder.mkdir()
    save_file(weights, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(layers)}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return pairs


def by_hand(toy: Toy, x: torch.Tensor, adapter: dict, scale: float) -> torch.Tensor:
    def layer(name: str, inputs: torch.Tensor) -> torch.Tensor:
        linear = getattr(toy.model, name.split(".")[-1])  # its weights: no hook
        out = nn.functional.linear(inputs, linear.weight, linear.bias)
        if name in adapter:
            a, b = adapter[name]
            out = out + scale * inputs @ a.T @ b.T
        return out

    return layer("model.down_proj", layer("model.q_proj", x))


def test_each_row_gets_its_own_adapters_delta(tmp_path: Path) -> None:
    torch.manual_seed(0)
    toy = Toy()
    x = torch.randn(3, 2, 6)
    with torch.no_grad():
        plain = toy(x)
    lora = BatchedLora(toy)
    alice = write_adapter(tmp_path / "alice", 2, 4, {"q_proj": (6, 4)}, seed=1)
    bob = write_adapter(tmp_path / "bob", 4, 4, {"q_proj": (6, 4), "down_proj": (4, 3)}, seed=2)
    slots = lora.load(tmp_path / "alice"), lora.load(tmp_path / "bob")
    with torch.no_grad():
        lora.select([slots[0], 0, slots[1]])  # alice's row, a base row, bob's row
        mixed = toy(x)
        lora.select([slots[1]] * 3)  # every row bob's
        all_bob = toy(x)
        lora.select([0, 0, 0])
        base = toy(x)
        assert torch.allclose(mixed[0], by_hand(toy, x[0], alice, 2.0), atol=1e-5)
        assert torch.allclose(mixed[1], plain[1], atol=1e-6)
        assert torch.allclose(mixed[2], by_hand(toy, x[2], bob, 1.0), atol=1e-5)
        assert torch.allclose(all_bob, by_hand(toy, x, bob, 1.0), atol=1e-5)
        assert torch.equal(base, plain)

    # a released slot holds zeros and is given to the next adapter; past the capacity the
    # stacks grow and keep what they held
    lora.release(slots[0])
    assert lora.load(tmp_path / "bob") == slots[0]
    before = lora.capacity
    more = [lora.load(tmp_path / "alice") for _ in range(before)]
    assert lora.capacity == before + GROW_SLOTS and len(set(more)) == len(more)
    with torch.no_grad():
        lora.select([more[-1], slots[1], 0])
        grown = toy(x)
    assert torch.allclose(grown[0], by_hand(toy, x[0], alice, 2.0), atol=1e-5)
    assert torch.allclose(grown[1], by_hand(toy, x[1], bob, 1.0), atol=1e-5)


def test_what_this_engine_cannot_serve_is_refused_by_name(tmp_path: Path) -> None:
    write_adapter(tmp_path / "dora", 2, 2, {"q_proj": (6, 4)}, seed=1)
    config = json.loads((tmp_path / "dora" / "adapter_config.json").read_text())
    (tmp_path / "dora" / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        read_adapter(tmp_path / "dora")
    write_adapter(tmp_path / "elsewhere", 2, 2, {"v_proj": (6, 4)}, seed=1)
    with pytest.raises(ValueError, match="layers the model lacks"):
        BatchedLora(Toy()).load(tmp_path / "elsewhere")
