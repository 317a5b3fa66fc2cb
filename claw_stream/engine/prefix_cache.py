"""Automatic prefix caching, as vLLM has it: the KV states of prompt blocks, shared by every
request whose prompt starts with the same tokens, across requests and sessions.

A block is `block_tokens` prompt tokens; it is keyed by a hash chained over every token before
it, and by the weights that computed it (`(adapter, version)`), so a block is found only for the
same prefix under the same weights: a weight swap makes every older block unreachable (the core
also drops them then, to free the memory). Blocks are evicted least recently used, deepest
first, under a byte budget; a lookup touches every block of the prefix it matched, so a block
is never older than the blocks after it and eviction never cuts a chain in the middle while
its tail is kept.

Why: an agent resends its whole conversation on every call. OpenClaw's system prompt and tools
are 8-18k tokens, and on 2 cores SmolLM2-135M prefilled 9.5k tokens in 37 s per call (docs/field-notes.md);
with the prefix cached, a later turn computes only the tokens its prompt added.

Only caches whose every layer is full attention (`DynamicLayer`) can be cut at any block: a
sliding-window layer keeps only its window, so models with such layers run without the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

WeightsKey = tuple[str | None, int]  # (adapter or None for the base model, weight version)


@dataclass
class _Block:
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, h, B, d]
    depth: int  # index of the block in its prompt
    nbytes: int
    used: int = 0  # lookup clock when last matched or stored


@dataclass
class PrefixCacheFigures:
    queried_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # of those, found in the cache
    stored_blocks: int = 0
    evicted_blocks: int = 0


@dataclass
class PrefixCache:
    budget_bytes: int
    block_tokens: int = 64
    figures: PrefixCacheFigures = field(default_factory=PrefixCacheFigures)

    def __post_init__(self) -> None:
        self._blocks: dict[tuple[WeightsKey, int], _Block] = {}
        self._bytes = 0
        self._clock = 0

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._blocks)

    def _hashes(self, ids: Sequence[int], n_blocks: int) -> list[int]:
        out: list[int] = []
        h = 0
        b = self.block_tokens
        for i in range(n_blocks):
            h = hash((h, tuple(ids[i * b : (i + 1) * b])))
            out.append(h)
        return out

    def lookup(
        self, weights: WeightsKey, ids: Sequence[int], limit: int
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The longest cached prefix of `ids` of at most `limit` tokens, in whole blocks: its
        length and, per layer, its keys and values [1, h, T, d] (fresh tensors)."""
        self.figures.queried_tokens += len(ids)
        self._clock += 1
        found: list[_Block] = []
        for h in self._hashes(ids, limit // self.block_tokens):
            block = self._blocks.get((weights, h))
            if block is None:
                break
            block.used = self._clock
            found.append(block)
        if not found:
            return 0, []
        n = len(found) * self.block_tokens
        self.figures.hit_tokens += n
        n_layers = len(found[0].layers)
        layers = [
            (
                torch.cat([blk.layers[i][0] for blk in found], dim=-2),
                torch.cat([blk.layers[i][1] for blk in found], dim=-2),
            )
            for i in range(n_layers)
        ]
        return n, layers

    def store(
        self,
        weights: WeightsKey,
        ids: Sequence[int],
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """Keep the blocks of a prompt just computed (`layers`: per layer keys and values of
        batch 1 covering at least `ids`); blocks already cached are only touched."""
        self._clock += 1
        b = self.block_tokens
        for depth, h in enumerate(self._hashes(ids, len(ids) // b)):
            key = (weights, h)
            block = self._blocks.get(key)
            if block is not None:
                block.used = self._clock
                continue
            kv = [
                (
                    k[:, :, depth * b : (depth + 1) * b].clone(),
                    v[:, :, depth * b : (depth + 1) * b].clone(),
                )
                for k, v in layers
            ]
            nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
            if nbytes > self.budget_bytes:
                return
            while self._bytes + nbytes > self.budget_bytes:
                if not self._evict_one(older_than=self._clock):
                    return  # only this prompt's own blocks are left: keep its head
            self._blocks[key] = _Block(kv, depth, nbytes, self._clock)
            self._bytes += nbytes
            self.figures.stored_blocks += 1

    def _evict_one(self, older_than: int) -> bool:
        key = min(self._blocks, key=lambda k: (self._blocks[k].used, -self._blocks[k].depth))
        if self._blocks[key].used >= older_than:
            return False
        self._bytes -= self._blocks.pop(key).nbytes
        self.figures.evicted_blocks += 1
        return True

    def drop(self, adapter: str | None = None, *, everything: bool = False) -> None:
        """Forget every block (a base weight swap: adapters sit on top of the base weights), or
        those of one adapter (unloaded)."""
        for key in list(self._blocks):
            if everything or key[0][0] == adapter:
                self._bytes -= self._blocks.pop(key).nbytes
