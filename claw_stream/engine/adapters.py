"""LoRA adapters over the engine's one base model: registered (servable, listed by /v1/models)
and resident (in a slot of the model's stacks, `batched_lora.py`). With a budget
(`engine.max_loaded_adapters`, vLLM's `--max-loras`), the least recently used idle adapter leaves the model when another must come
in, and a request for it loads it again from its folder. Used on the engine thread only."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from claw_stream.engine.batched_lora import BatchedLora
from claw_stream.names import adapter_policy


@dataclass
class AdapterFigures:
    """Counted on the engine thread, read by the metrics (`EngineMetrics.sync_adapters`)."""

    loads: int = 0  # into the model: first loads and reloads
    reloads: int = 0  # of an adapter evicted earlier, for a request that named it
    evictions: int = 0  # out of the model past the budget
    load_seconds: float = 0.0


class Adapters:
    def __init__(self, model: nn.Module, budget: int | None):
        self.batched = BatchedLora(model)
        self.budget = budget
        self.versions: dict[str, int] = {}  # registered: name -> weight version
        self.paths: dict[str, str] = {}
        # resident: name -> its slot, least recently used first
        self.resident: OrderedDict[str, int] = OrderedDict()
        self.figures = AdapterFigures()

    def register(self, name: str, path: str, version: int, busy: Collection[str]) -> None:
        """Servable from now on, and in the model (KeyError: registered already)."""
        if name in self.versions:
            raise KeyError(name)
        self.paths[name] = path
        try:
            self.make_resident(name, busy)
        except Exception:
            del self.paths[name]
            raise
        self.versions[name] = version

    def drop(self, name: str) -> None:
        """No longer servable (KeyError: not registered)."""
        if name not in self.versions:
            raise KeyError(name)
        if name in self.resident:
            self._evict(name)
        del self.versions[name]
        del self.paths[name]

    def make_resident(self, name: str, busy: Collection[str]) -> None:
        """`name` in the model, most recently used. Adapters in `busy` (with requests running)
        stay: the budget is passed until they finish, never a request refused."""
        if name in self.resident:
            self.resident.move_to_end(name)
            return
        if self.budget is not None:
            idle = [a for a in self.resident if a not in busy]
            for victim in idle[: max(0, len(self.resident) + 1 - self.budget)]:
                self._evict(victim)
                self.figures.evictions += 1
        started = time.perf_counter()
        slot = self.batched.load(Path(self.paths[name]))
        f = self.figures
        f.loads += 1
        f.reloads += name in self.versions  # registered before: it was evicted
        f.load_seconds += time.perf_counter() - started
        self.resident[name] = slot

    def use(self, names: list[str | None]) -> None:
        """The next forwards compute row i with adapter names[i] (None: the base model), each
        resident."""
        self.batched.select([0 if n is None else self.resident[n] for n in names])

    def newest(self, policy: str) -> str | None:
        """The newest registered `policy@vN`, if any."""
        versioned = [(v, n) for n, v in self.versions.items() if adapter_policy(n) == policy]
        newest = max(versioned, default=None)
        return newest[1] if newest is not None else None

    def _evict(self, name: str) -> None:
        self.batched.release(self.resident.pop(name))
