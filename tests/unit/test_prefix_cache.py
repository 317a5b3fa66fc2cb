"""The prefix cache's bookkeeping: longest whole-block prefix, weights kept apart, eviction
least recently used and deepest first under the byte budget, dropping on weight changes."""

from __future__ import annotations

import torch

from claw_stream.engine.prefix_cache import PrefixCache

B = 4  # tokens per block
LAYERS = 2


def kv_of(ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, keys and values [1, 1, T, 1] whose entries are the token ids (and negated)."""
    t = torch.tensor(ids, dtype=torch.float32).view(1, 1, -1, 1)
    return [(t + layer, -t - layer) for layer in range(LAYERS)]


BLOCK_BYTES = LAYERS * 2 * B * 4  # float32


def test_the_longest_cached_whole_block_prefix_is_found_with_its_states() -> None:
    cache = PrefixCache(budget_bytes=10 * BLOCK_BYTES, block_tokens=B)
    prompt = list(range(10, 21))  # 11 tokens: 2 whole blocks
    cache.store((None, 0), prompt, kv_of(prompt))
    assert len(cache) == 2 and cache.used_bytes == 2 * BLOCK_BYTES
    asked = [*prompt[:9], 99, 98]
    n, layers = cache.lookup((None, 0), asked, limit=len(asked) - 1)
    assert n == 8
    assert [len(layers), *layers[1][0].shape] == [LAYERS, 1, 1, 8, 1]
    assert torch.equal(layers[1][0].flatten(), torch.tensor(prompt[:8], dtype=torch.float32) + 1)
    assert torch.equal(layers[0][1].flatten(), -torch.tensor(prompt[:8], dtype=torch.float32))
    # the limit keeps at least one token to compute; another first block matches nothing
    assert cache.lookup((None, 0), prompt[:8], limit=7)[0] == 4
    assert cache.lookup((None, 0), [0, *prompt[1:]], limit=10)[0] == 0
    assert (cache.figures.queried_tokens, cache.figures.hit_tokens) == (11 + 8 + 11, 8 + 4)


def test_other_weights_never_see_a_block() -> None:
    cache = PrefixCache(budget_bytes=10 * BLOCK_BYTES, block_tokens=B)
    prompt = list(range(9))
    cache.store((None, 0), prompt, kv_of(prompt))
    assert cache.lookup((None, 1), prompt, 8)[0] == 0
    assert cache.lookup(("lora@v3", 0), prompt, 8)[0] == 0
    cache.store(("lora@v3", 0), prompt, kv_of(prompt))
    cache.drop("lora@v3")
    assert cache.lookup(("lora@v3", 0), prompt, 8)[0] == 0
    assert cache.lookup((None, 0), prompt, 8)[0] == 8
    cache.drop(everything=True)
    assert len(cache) == 0 and cache.used_bytes == 0


def test_eviction_is_least_recently_used_then_deepest_first() -> None:
    cache = PrefixCache(budget_bytes=4 * BLOCK_BYTES, block_tokens=B)
    shared = [1, 2, 3, 4]
    a = [*shared, 5, 6, 7, 8, 9, 9, 9, 9]
    b = [*shared, 50, 60, 70, 80]
    cache.store((None, 0), a, kv_of(a))  # 3 blocks
    cache.store((None, 0), b, kv_of(b))  # shares the first: 1 new block
    assert len(cache) == 4
    cache.lookup((None, 0), [*b, 0], limit=8)  # b's chain is now the most recent
    c = [7, 7, 7, 7]
    cache.store((None, 0), c, kv_of(c))  # evicts a's deepest block
    assert cache.lookup((None, 0), [*a, 0], limit=12)[0] == 8
    assert cache.lookup((None, 0), [*b, 0], limit=8)[0] == 8
    assert cache.figures.evicted_blocks == 1
    assert cache.used_bytes == 4 * BLOCK_BYTES


def test_a_prompt_larger_than_the_budget_keeps_its_head() -> None:
    cache = PrefixCache(budget_bytes=2 * BLOCK_BYTES, block_tokens=B)
    long = list(range(20))
    cache.store((None, 0), long, kv_of(long))
    assert cache.lookup((None, 0), long, limit=19)[0] == 8
    assert cache.used_bytes == 2 * BLOCK_BYTES
