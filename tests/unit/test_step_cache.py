"""The stitcher's memory of decoded steps: a byte budget, least recently used out, forget."""

from __future__ import annotations

from claw_stream.worker.stages.step_cache import StepCache

from ..support.worker import chat


def test_the_least_recently_used_steps_leave_first_under_the_budget() -> None:
    a1, a2 = chat("a", ["one", "two"])
    (b1,) = chat("b", ["one"])
    cache = StepCache(max_bytes=250)
    cache.put(a1, 100)
    cache.put(a2, 100)
    cache.put(b1, 100)  # 300 > 250: the oldest goes
    assert cache.bytes == 200 and len(cache) == 2
    assert set(cache.held(["a"])) == {a2.step_id}
    assert set(cache.held(["b"])) == {b1.step_id}
    cache.put(a1, 1000)  # larger than the whole budget: not held, nothing else dropped
    assert cache.bytes == 200
    cache.held(["b"])  # read: b1 is now the most recent, a2 goes next
    cache.put(a1, 100)
    assert set(cache.held(["a"])) == {a1.step_id} and set(cache.held(["b"])) == {b1.step_id}


def test_a_step_put_again_is_counted_once_and_a_forgotten_session_leaves_memory() -> None:
    a1, a2 = chat("a", ["one", "two"])
    cache = StepCache(max_bytes=10_000)
    cache.put(a1, 100)
    cache.put(a1, 100)
    cache.put(a2, 50)
    assert cache.bytes == 150
    cache.drop_sessions(["a"])
    assert cache.bytes == 0 and len(cache) == 0 and cache.held(["a"]) == {}
