"""Two users of opposite tastes on one SmolLM2 stack, each with an adapter of its own
(`tenants.adapters`), asking the same kind of questions for an answer in one or two sentences:
alice wants answers under 30 words, bob 30 words or more. They talk at once through `claw-stream up`, thumbs on every answer; each adapter moves its own tenant's way
on held-out questions it never trained on, and the shared policy is untouched. Then the
held-out replay and the report run per tenant (`eval --replay --tenant`, `report --tenant`),
the replay scored by the tenant's rule with the real SmolLM2 judge voting beside it."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from claw_stream.demo.held_out import HELD_OUT_QUESTIONS, answered_now
from claw_stream.demo.persona import ASK_BRIEFLY, Persona
from claw_stream.demo.run import run_demo
from claw_stream.demo.tally import HeldOutAnswer, Tally, mean_words

from ..support.stack import Up

ADMIN = "tenant-learning-admin"
TASTES = {"alice": Persona(30, "short", ASK_BRIEFLY), "bob": Persona(30, "long", ASK_BRIEFLY)}
QUESTIONS = HELD_OUT_QUESTIONS
EPISODES = 16  # per tenant, two answers each: ~8 versions of each adapter (learning_bench)


async def _held_out(gateway: str, tenant: str | None) -> tuple[int, list[HeldOutAnswer]]:
    """The held-out questions asked once of what serves `tenant` now (its newest adapter;
    None: the shared policy), as side calls of an untrained session."""
    return await answered_now(gateway, ADMIN, TASTES[tenant or "alice"], QUESTIONS, tenant=tenant)


def _settled(up: Up, quiet_s: float = 15, timeout: float = 240) -> None:
    """Until the trainer has published nothing for `quiet_s` (the gateways' lists have caught
    up by then: they refresh every 5 s)."""
    query = "SELECT count(*) AS n FROM weight_versions"
    seen, since, deadline = -1, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = up.rows(query)[0]["n"]
        if n != seen:
            seen, since = n, time.monotonic()
        elif time.monotonic() - since > quiet_s:
            return
        time.sleep(3)
    raise AssertionError(f"the trainer was still publishing after {timeout} s\n{up.logs()}")


def test_two_tenants_of_opposite_tastes_each_move_their_own_adapter_and_not_the_policy(
    tmp_path: Path,
) -> None:
    up = Up(
        tmp_path / "claw",
        CLAW_ADMIN_KEY=ADMIN,
        CLAW_TENANTS__ADAPTERS='["alice", "bob"]',
        CLAW_TENANTS__LR="5e-4",
        CLAW_EVAL__HOLDOUT_SHARE="0.25",
        CLAW_WORKER__PRM_VOTES="0",  # the persona's thumbs are the reward
    )
    gateway = f"http://127.0.0.1:{up.gateway_port}"
    try:
        up.wait_ready(240)
        version, before = asyncio.run(_held_out(gateway, None))
        assert version == 0

        async def talk() -> list[Tally]:
            return await asyncio.gather(
                *(
                    run_demo(
                        gateway,
                        ADMIN,
                        EPISODES,
                        concurrency=4,
                        persona=persona,
                        seed=k,
                        tenant=name,
                    )
                    for k, (name, persona) in enumerate(TASTES.items())
                )
            )

        tallies = dict(zip(TASTES, asyncio.run(talk()), strict=True))
        _settled(up)
        after: dict[str, tuple[int, list[HeldOutAnswer]]] = {
            name: asyncio.run(_held_out(gateway, name)) for name in TASTES
        }
        shared_version, shared_after = asyncio.run(_held_out(gateway, None))
        logs = up.logs()

        # each tenant was served by its own adapter as it trained, numbered on its own
        for name, tally in tallies.items():
            assert max(a.version for a in tally.answers) >= 1, (name, logs)
            assert after[name][0] >= 1, (name, logs)
        # each adapter moved its own tenant's way on the held-out questions
        v0 = mean_words(before)
        alice, bob = mean_words(after["alice"][1]), mean_words(after["bob"][1])
        assert alice < v0 < bob, (alice, v0, bob, logs)
        liked = {n: sum(a.liked for a in after[n][1]) for n in TASTES}
        liked_v0 = {
            n: sum(TASTES[n].likes(" ".join(["w"] * a.words)) for a in before) for n in TASTES
        }
        # by each tenant's own rule: bob's is the bigger move (42% -> 100% of his held-out
        # answers in the bench, alice's 58% -> 88%, ~70% after 8 versions)
        assert liked["alice"] >= liked_v0["alice"] and liked["bob"] > liked_v0["bob"], (
            liked,
            liked_v0,
            logs,
        )
        # the shared policy is untouched: no version, no step, the same answers
        assert shared_version == 0
        assert [a.words for a in shared_after] == [a.words for a in before]
        steps = up.rows("SELECT policy, count(*) AS n FROM training_steps GROUP BY policy")
        assert {r["policy"] for r in steps} == {"alice", "bob"}, steps
        versions = up.rows("SELECT DISTINCT policy FROM weight_versions WHERE version > 0")
        assert {r["policy"] for r in versions} == {"alice", "bob"}

        # the held-out replay of alice: her turns only, asked again of her adapter, scored by
        # her rule with the judge's votes beside
        replay = up.cli(
            "eval",
            "--replay",
            "--tenant",
            "alice",
            CLAW_EVAL__REPLAY_RULE="tests.support.rules:under_30_words",
            CLAW_EVAL__REPLAY_VOTES="1",
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr + logs
        rows = up.rows(
            "SELECT r.policy, r.version, r.scorer, r.judge, s.tenant FROM replay_results r "
            "JOIN turns t ON t.turn_id = r.turn_id JOIN steps s ON s.step_id = t.step_id"
        )
        assert rows, replay.stdout + logs
        assert {(r["policy"], r["tenant"]) for r in rows} == {("alice", "alice")}
        assert {r["version"] for r in rows} == {after["alice"][0]}  # her newest adapter answered
        assert {r["scorer"] for r in rows} == {"rule:tests.support.rules:under_30_words"}
        assert {r["judge"] for r in rows} == {"smollm2-135m"}  # the real judge voted beside

        # the report of bob's adapter: his versions, his live turns
        report = up.cli("report", "--tenant", "bob", "--out", str(tmp_path / "bob"))
        assert report.returncode == 0, report.stdout + report.stderr
        said = " ".join(report.stdout.split())
        assert "tenant bob" in said, report.stdout
        assert (tmp_path / "bob" / "report.html").is_file()

        # the demo as a user plays it for a tenant: its adapter answers, its report closes
        demo = up.cli(
            "demo",
            "--episodes",
            "1",
            "--tenant",
            "bob",
            "--wants",
            "long",
            "--brief",
            "--no-held-out",
            "--no-replay",
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        played = " ".join(demo.stdout.split())
        assert "bob: versions (tenant bob)" in played, demo.stdout
        assert "live answers per version" in played
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, up.logs()
