"""Gated serving and rollback on real parts: the built-in engine swaps back to an older version
under streaming traffic; a candidate the real trainer made worse (inverted rewards) is evaluated
on a candidate engine, rejected and never served; `claw-stream rollback` serves an older version
with no failed request; a gated trainer goes back to the serving version's weights."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest
import torch
from transformers import AutoTokenizer

from claw_stream.bus.topics import apply_topics
from claw_stream.events import WeightEvent
from claw_stream.settings import Settings, load_settings
from claw_stream.store.db import asyncpg_dsn, make_engine
from claw_stream.trainer.config import TrainerSettings
from claw_stream.trainer.policy import PolicyTrainer
from claw_stream.versions.announce import announce
from claw_stream.versions.promotion import decide
from claw_stream.worker.state import outbox

from ..support.engine import ADMIN_KEY, OTHER_PROMPT, PROMPT, EngineProcess
from ..support.gateway import GatewayProcess
from ..support.processes import child_env, free_port
from ..support.trainer import (
    TrainerRun,
    make_samples,
    produce,
    served_version,
    weight_events,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ALPHA, BRAVO = "alpha alpha alpha", "bravo bravo bravo"


def say(engine: EngineProcess, prompt: list[dict] = PROMPT) -> tuple[str, int]:
    r = httpx.post(
        engine.base_url + "/v1/chat/completions",
        json={"model": "policy", "messages": prompt, "temperature": 0, "max_tokens": 12},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["message"]["content"], body["weight_version"]


def load(engine: EngineProcess, path: Path, version: int, **extra: bool) -> httpx.Response:
    return httpx.post(
        engine.base_url + "/admin/load_weights",
        json={"path": str(path), "version": version, **extra},
        headers=ADMIN,
        timeout=60,
    )


class Traffic:
    """Streaming chat requests in a loop on a thread until stopped; every failure kept."""

    def __init__(self, engine: EngineProcess, clients: int = 4):
        self.engine, self.failures, self.answers = engine, list[str](), list[str]()
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run(clients)))
        self.thread.start()

    async def _one(self) -> None:
        async with httpx.AsyncClient(base_url=self.engine.base_url, timeout=60) as c:
            while not self.stop_flag.is_set():
                body = {"model": "policy", "messages": PROMPT, "temperature": 0, "max_tokens": 12}
                text, done = "", False
                try:
                    async with c.stream(
                        "POST", "/v1/chat/completions", json={**body, "stream": True}
                    ) as r:
                        if r.status_code != 200:
                            self.failures.append(f"{r.status_code} {await r.aread()!r}")
                            continue
                        async for line in r.aiter_lines():
                            if line == "data: [DONE]":
                                done = True
                            elif line.startswith("data: "):
                                chunk = json.loads(line[6:])
                                if "error" in chunk:
                                    self.failures.append(line)
                                for choice in chunk.get("choices", []):
                                    text += choice.get("delta", {}).get("content") or ""
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                if not done:
                    self.failures.append(f"stream ended without [DONE]: {text!r}")
                self.answers.append(text)

    async def _run(self, clients: int) -> None:
        await asyncio.gather(*(self._one() for _ in range(clients)))

    def until(self, n: int, what: str, timeout_s: float = 120.0) -> None:
        """Wait until `n` answers in all were streamed whole (not so many seconds: on a loaded
        machine a 1.5 s window saw fewer than the test asked for)."""
        deadline = time.monotonic() + timeout_s
        while len(self.answers) < n:
            assert self.thread.is_alive(), self.failures
            assert time.monotonic() < deadline, (
                f"{len(self.answers)} of {n} answers after {timeout_s:.0f} s ({what}):"
                f" {self.failures}"
            )
            time.sleep(0.05)

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=60)


def test_the_engine_goes_back_only_when_told_and_no_stream_fails(tiny_models, tmp_path) -> None:
    engine = EngineProcess(tiny_models["alpha"], tmp_path, "--served-model-name", "policy")
    try:
        assert load(engine, tiny_models["bravo"], 5).status_code == 200
        assert say(engine) == (BRAVO, 5)
        traffic = Traffic(engine)
        traffic.until(2, "before the loads")
        # a stale trainer's older version is refused; a rollback is not
        stale = load(engine, tiny_models["alpha"], 3)
        assert stale.status_code == 409 and "not newer" in stale.json()["error"]["message"]
        back = load(engine, tiny_models["alpha"], 3, rollback=True)
        assert back.status_code == 200 and back.json()["weight_version"] == 3
        traffic.until(len(traffic.answers) + 2, "after the rollback")
        traffic.stop()
        assert traffic.failures == []
        assert len(traffic.answers) >= 4
        assert say(engine) == (ALPHA, 3)
        # and forward again from there, without the flag
        assert load(engine, tiny_models["bravo"], 4).status_code == 200
        assert say(engine) == (BRAVO, 4)
    finally:
        engine.stop()


def word_dataset(folder: Path) -> Path:
    """Held-out tasks the alpha model passes: its two words, checked exactly."""
    path = folder / "words.jsonl"
    tasks = [
        {"id": "word-0", "prompt": PROMPT[0]["content"], "expected": ALPHA},
        {
            "id": "word-1",
            "prompt": OTHER_PROMPT[0]["content"],
            "expected": "charlie charlie charlie",
        },
    ]
    path.write_text("".join(json.dumps({**t, "checker": {"kind": "exact"}}) + "\n" for t in tasks))
    return path


def gated(
    env: dict[str, str],
    tmp: Path,
    candidate_engine: EngineProcess,
    monkeypatch: pytest.MonkeyPatch,
    **more: str,
) -> tuple[dict[str, str], Settings]:
    """The trainer's env under serving.policy gated, evaluated on the word dataset; the
    promoter runs in this process, with the same settings."""
    env = env | {
        "CLAW_SERVING__POLICY": "gated",
        "CLAW_SERVING__CANDIDATE_ENGINES": json.dumps([candidate_engine.base_url]),
        "CLAW_EVAL__DATASET": str(word_dataset(tmp)),
        "CLAW_EVAL__AGENT": "chat",
        "CLAW_EVAL__MAX_TOKENS": "12",
        "CLAW_TRAINER__NORMALISE": "none",
        **more,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env, load_settings()


async def _rows(database: str, query: str, *args: object) -> list[dict]:
    conn = await asyncpg.connect(asyncpg_dsn(database))
    try:
        return [dict(r) for r in await conn.fetch(query, *args)]
    finally:
        await conn.close()


async def _serving(database: str, policy: str) -> int:
    engine = make_engine(database)
    try:
        async with engine.connect() as conn:
            return (await outbox.gate(conn, policy, 60)).version
    finally:
        await engine.dispose()


def test_a_worse_candidate_is_rejected_and_rollback_serves_an_older_version(
    trainer_env,
    broker,
    database,
    tiny_models,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env, serving_engine, topic, policy, tmp = trainer_env
    candidate_engine = EngineProcess(tiny_models["alpha"], tmp, "--served-model-name", "policy")
    checkpoints = tmp / "data" / "checkpoints"
    env, settings = gated(
        env,
        tmp,
        candidate_engine,
        monkeypatch,
        # the rewards are inverted: the words the evaluation wants are punished
        CLAW_TRAINER__LR="1e-2",
        CLAW_TRAINER__PUSH_EVERY="3",
    )
    try:
        # v1: the alpha model, trained and served before (its checkpoint is kept)
        shutil.copytree(tiny_models["alpha"], checkpoints / "v1")
        assert load(serving_engine, checkpoints / "v1", 1).status_code == 200
        ready = WeightEvent(
            policy=policy, version=1, status="ready", checkpoint_path=str(checkpoints / "v1")
        )
        asyncio.run(announce(settings, ready))

        # the real trainer, gated, learns from inverted rewards for three steps (at a rate that
        # moves a tiny model far): candidate v2
        tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
        inverted = [(BRAVO, 1.0), (ALPHA, -1.0)]
        produce(broker, topic, make_samples(tokenizer, inverted * 3))
        run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer.log", "--max-steps", "3")
        assert run.proc.wait(timeout=240) == 0, run.output()
        assert served_version(candidate_engine) == 2 and served_version(serving_engine) == 1
        events = weight_events(broker, policy)
        assert [(e.status, e.version) for e in events] == [("ready", 1), ("candidate", 2)]
        assert say(candidate_engine)[0] != ALPHA, "inverted rewards left the candidate as good"

        # the promoter scores the serving version and the candidate, and rejects it
        verdict = asyncio.run(decide(settings, settings.eval, events[-1]))
        assert verdict is not None and not verdict.promote, verdict
        assert say(serving_engine) == (ALPHA, 1)
        rejected = weight_events(broker, policy)[-1]
        assert (rejected.status, rejected.version) == ("rejected", 2)
        assert "serving v1 scored 1.0000" in (rejected.error or ""), rejected.error
        scores = asyncio.run(
            _rows(database, "SELECT version, score FROM eval_runs WHERE policy = $1", policy)
        )
        by_version = {r["version"]: r["score"] for r in scores}
        assert len(scores) == 2 and by_version[1] == 1.0 and by_version[2] < 1.0, scores
        versions = asyncio.run(
            _rows(
                database,
                "SELECT version, status FROM weight_versions WHERE policy = $1 ORDER BY 1",
                policy,
            )
        )
        assert [(r["version"], r["status"]) for r in versions] == [(1, "ready"), (2, "rejected")]
        assert asyncio.run(_serving(database, policy)) == 1

        # the trainer, started again from its newest checkpoint (the rejected v2), goes on from
        # the serving v1 and numbers its next candidate v3 (one gentle step: v3 still answers)
        produce(broker, topic, make_samples(tokenizer, [(ALPHA, 1.0), (BRAVO, -1.0)]))
        again = TrainerRun(
            env | {"CLAW_TRAINER__PUSH_EVERY": "1", "CLAW_TRAINER__LR": "1e-5"},
            tiny_models["alpha"],
            tmp / "trainer-again.log",
            "--max-steps",
            "1",
        )
        assert again.proc.wait(timeout=240) == 0, again.output()
        assert "serving is v1: training goes on from it (was v2)" in again.output()
        assert served_version(candidate_engine) == 3 and served_version(serving_engine) == 1
        last = weight_events(broker, policy)[-1]
        assert (last.status, last.version) == ("candidate", 3)

        # the promoter as `claw-stream up` runs it: v3 (trained on the right rewards) is as good
        # as v1 and goes to the serving engine; the replayed v2 is not decided again
        eval_port = free_port()
        follow = subprocess.Popen(
            [sys.executable, "-m", "claw_stream", "eval", "--follow"],
            env=child_env(**env, CLAW_EVAL__METRICS_PORT=str(eval_port)),
            stdout=(tmp / "follow.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        try:
            # beside a one-core burner and the tenant test the promoter took over 120 s
            deadline = time.monotonic() + 300
            while served_version(serving_engine) != 3 and time.monotonic() < deadline:
                log = (tmp / "follow.log").read_text()
                assert follow.poll() is None and "rejected v3" not in log, log
                time.sleep(1)
            metrics = httpx.get(f"http://127.0.0.1:{eval_port}/metrics").text
        finally:
            follow.terminate()
            follow.wait(timeout=30)
        assert say(serving_engine) == (ALPHA, 3), (tmp / "follow.log").read_text()
        decided = [(e.status, e.version) for e in weight_events(broker, policy)]
        assert decided[-1] == ("ready", 3) and decided.count(("rejected", 2)) == 1, decided
        assert "claw_eval_score{" in metrics

        # v4 (bravo) went out, then is rolled back to v1 from the command line under traffic
        shutil.copytree(tiny_models["bravo"], checkpoints / "v4")
        assert load(serving_engine, checkpoints / "v4", 4).status_code == 200
        ready4 = WeightEvent(
            policy=policy, version=4, status="ready", checkpoint_path=str(checkpoints / "v4")
        )
        asyncio.run(announce(settings, ready4))
        assert asyncio.run(_serving(database, policy)) == 4
        traffic = Traffic(serving_engine)
        traffic.until(2, "before the rollback")

        def rollback(to: int) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "claw_stream", "rollback", "--to", str(to)],
                env=child_env(**env),
                capture_output=True,
                text=True,
                timeout=120,
            )

        cli = rollback(1)
        traffic.until(len(traffic.answers) + 2, "after the rollback")
        traffic.stop()
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert "serving v1 (was v4)" in cli.stdout
        assert traffic.failures == [] and len(traffic.answers) >= 4
        assert say(serving_engine) == (ALPHA, 1)
        back = weight_events(broker, policy)[-1]
        assert (back.status, back.version, back.rolled_back_from) == ("ready", 1, 4)
        assert asyncio.run(_serving(database, policy)) == 1  # staleness counts from v1 now
        missing = rollback(9)
        assert missing.returncode != 0 and "no checkpoint of version 9" in missing.stderr
    finally:
        candidate_engine.stop()


def test_a_tenants_adapter_is_served_only_once_promoted(
    trainer_env, broker, database, tiny_models, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gated, a tenant's adapter steps are candidates on the candidate engine: a worse one
    (inverted rewards) is rejected against what serves the tenant (the shared policy, as it has
    no adapter yet) and never reaches the serving engine; the trainer then starts the adapter
    again, and its next candidate, as good, is promoted and served by its name."""
    env, serving_engine, topic, _, tmp = trainer_env
    candidate_engine = EngineProcess(tiny_models["alpha"], tmp, "--served-model-name", "policy")
    alice = f"alice-{uuid.uuid4().hex[:6]}"
    env, settings = gated(
        env,
        tmp,
        candidate_engine,
        monkeypatch,
        CLAW_TENANTS__ADAPTERS=json.dumps([alice]),
        CLAW_TENANTS__LORA_R="8",
        CLAW_TENANTS__LR="5e-2",
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])

    def hers(answers: list[tuple[str, float]]) -> list:
        return [s.model_copy(update={"tenant": alice}) for s in make_samples(tokenizer, answers)]

    def adapters(engine: EngineProcess) -> set[str]:
        cards = httpx.get(engine.base_url + "/v1/models", headers=ADMIN).json()["data"]
        return {c["id"] for c in cards if c["id"].startswith(alice)}

    def statuses() -> list[tuple[str, int]]:
        return [(e.status, e.version) for e in weight_events(broker, alice)]

    try:
        # the shared policy serves v1 (alpha's weights): what serves her before an adapter
        assert load(serving_engine, tiny_models["alpha"], 1).status_code == 200
        # inverted rewards, three steps of her adapter: candidates v1 to v3
        produce(broker, topic, hers([(BRAVO, 1.0), (ALPHA, -1.0)] * 3), key=alice)
        run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer.log", "--max-steps", "3")
        assert run.proc.wait(timeout=240) == 0, run.output()
        assert statuses() == [("candidate", 1), ("candidate", 2), ("candidate", 3)]
        assert adapters(candidate_engine) == {f"{alice}@v{v}" for v in (1, 2, 3)}
        assert adapters(serving_engine) == set()

        events = weight_events(broker, alice)
        verdict = asyncio.run(decide(settings, settings.eval, events[-1]))
        assert verdict is not None and not verdict.promote, verdict
        assert statuses()[-1] == ("rejected", 3) and adapters(serving_engine) == set()
        scores = asyncio.run(
            _rows(database, "SELECT version, score FROM eval_runs WHERE policy = $1", alice)
        )
        by_version = {r["version"]: r["score"] for r in scores}  # her v0: the policy's v1
        assert set(by_version) == {0, 3} and by_version[0] == 1.0 > by_version[3], scores

        # the right rewards, gently: the adapter starts again (none was served), candidate v4
        produce(broker, topic, hers([(ALPHA, 1.0), (BRAVO, -1.0)]), key=alice)
        again = TrainerRun(
            env | {"CLAW_TENANTS__LR": "1e-4"},
            tiny_models["alpha"],
            tmp / "trainer-again.log",
            "--max-steps",
            "1",
        )
        assert again.proc.wait(timeout=240) == 0, again.output()
        assert f"tenant {alice}: serving is v0" in again.output(), again.output()
        assert statuses()[-1] == ("candidate", 4)
        verdict = asyncio.run(decide(settings, settings.eval, weight_events(broker, alice)[-1]))
        assert verdict is not None and verdict.promote, verdict
        assert statuses()[-1] == ("ready", 4)
        assert adapters(serving_engine) == {f"{alice}@v4"}
        r = httpx.post(
            serving_engine.base_url + "/v1/chat/completions",
            json={"model": f"{alice}@v4", "messages": PROMPT, "temperature": 0, "max_tokens": 12},
            timeout=60,
        )
        assert (r.json()["choices"][0]["message"]["content"], r.json()["weight_version"]) == (
            ALPHA,
            4,
        )
    finally:
        candidate_engine.stop()


def test_a_gated_trainer_goes_on_from_the_serving_weights(tiny_models) -> None:
    """After a rejection or a rollback the trainer loads the serving checkpoint in place; the
    next step starts from it (ZeRO's fp32 copy is refreshed too, or the step would restore the
    weights trained before)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    trainer = PolicyTrainer(tiny_models["alpha"], TrainerSettings(lr=1e-2, normalise="none"))
    original = {k: v.detach().clone() for k, v in trainer.engine.module.state_dict().items()}

    def distance() -> float:
        now = trainer.engine.module.state_dict()
        return sum(float((now[k] - v).abs().sum()) for k, v in original.items())

    inverted = [(BRAVO, 1.0), (ALPHA, -1.0)]
    for _ in range(4):
        trainer.train_step(make_samples(tokenizer, inverted))
    trained = distance()
    assert trained > 0
    trainer.go_back_to(tiny_models["alpha"], 1)
    assert distance() == 0 and trainer.state.version == 1
    trainer.train_step(make_samples(tokenizer, inverted))
    assert 0 < distance() < trained / 2


def test_a_gated_lora_trainer_goes_back_to_the_serving_adapter(tiny_models, tmp_path) -> None:
    """The shared policy trained as a LoRA adapter goes back to a served adapter's weights (a
    rejection), its optimizer moments cleared."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    config = TrainerSettings(lora=True, lora_r=4, lr=1e-2, normalise="none")
    trainer = PolicyTrainer(tiny_models["alpha"], config)
    inverted = [(BRAVO, 1.0), (ALPHA, -1.0)]
    trainer.train_step(make_samples(tokenizer, inverted))
    served = trainer.save(tmp_path, 1, {}, [])

    def adapter() -> dict[str, torch.Tensor]:
        module = trainer.engine.module
        return {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" in n}

    at_v1 = adapter()
    for _ in range(3):
        trainer.train_step(make_samples(tokenizer, inverted))
    assert any(not torch.equal(at_v1[n], p) for n, p in adapter().items())
    trainer.go_back_to(served, 1)
    assert all(torch.equal(at_v1[n], p) for n, p in adapter().items())
    assert trainer.state.version == 1


def test_the_watchdog_rolls_back_a_version_trained_on_inverted_rewards(
    trainer_env,
    broker,
    database,
    tiny_models,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under serving.policy latest every version serves at once: a version the real trainer made
    worse (inverted rewards) reaches users, loses to the one before on the held-out tasks, and
    the watchdog serves that one again, with no failed request and its reason in the report."""
    env, serving_engine, topic, policy, tmp = trainer_env
    checkpoints = tmp / "data" / "checkpoints"
    asyncio.run(apply_topics(broker))
    (tmp / "gw-data").mkdir()
    gateway = GatewayProcess(broker, database, [serving_engine.base_url], tmp / "gw-data")
    env |= {
        "CLAW_EVAL__DATASET": str(word_dataset(tmp)),
        "CLAW_EVAL__AGENT": "chat",
        "CLAW_EVAL__MAX_TOKENS": "12",
        "CLAW_SERVING__WATCHDOG__ENABLED": "true",
        "CLAW_SERVING__WATCHDOG__PATIENCE": "1",  # one bad version is enough here
        "CLAW_TRAINER__LR": "1e-2",
        "CLAW_TRAINER__PUSH_EVERY": "3",
        "CLAW_TRAINER__NORMALISE": "none",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    eval_port = free_port()
    follow: subprocess.Popen[bytes] | None = None
    try:
        # v1: the alpha model, served (its checkpoint kept), passes both held-out tasks
        shutil.copytree(tiny_models["alpha"], checkpoints / "v1")
        assert load(serving_engine, checkpoints / "v1", 1).status_code == 200
        ready = WeightEvent(
            policy=policy, version=1, status="ready", checkpoint_path=str(checkpoints / "v1")
        )
        asyncio.run(announce(load_settings(), ready))
        # the evaluator as `claw-stream up` runs it (eval.on_ready), through the gateway
        args = ["eval", "--follow", "--base-url", gateway.base_url]
        follow = subprocess.Popen(
            [sys.executable, "-m", "claw_stream", *args],
            env=child_env(**env, CLAW_EVAL__METRICS_PORT=str(eval_port)),
            stdout=(tmp / "follow.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        query = "SELECT version, item, score FROM held_out_results WHERE policy = $1"
        deadline = time.monotonic() + 120
        while len(asyncio.run(_rows(database, query, policy))) < 2:
            assert follow.poll() is None, (tmp / "follow.log").read_text()
            assert time.monotonic() < deadline, (tmp / "follow.log").read_text()
            time.sleep(1)

        # users keep calling while the real trainer, under latest, serves v2 from inverted
        # rewards and the watchdog takes it back
        traffic = Traffic(serving_engine)
        tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
        produce(broker, topic, make_samples(tokenizer, [(BRAVO, 1.0), (ALPHA, -1.0)] * 3))
        run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer.log", "--max-steps", "3")
        assert run.proc.wait(timeout=240) == 0, run.output()
        deadline = time.monotonic() + 120
        while not (back := [e for e in weight_events(broker, policy) if e.rolled_back_from]):
            assert follow.poll() is None, (tmp / "follow.log").read_text()
            assert time.monotonic() < deadline, (tmp / "follow.log").read_text()
            time.sleep(1)
        traffic.until(max(4, len(traffic.answers) + 2), "after the watchdog's rollback")
        traffic.stop()
        assert traffic.failures == [] and len(traffic.answers) >= 4
        statuses = [(e.status, e.version) for e in weight_events(broker, policy)]
        assert statuses == [("ready", 1), ("updating", 2), ("ready", 2), ("ready", 1)], statuses
        assert (back[0].version, back[0].rolled_back_from) == (1, 2)
        assert say(serving_engine) == (ALPHA, 1)
        reason = back[0].reason or ""
        assert reason.startswith("watchdog: held-out win rate against v1 below 40% for 1 "), reason
        scores = asyncio.run(_rows(database, query, policy))
        by_version = {(r["version"], r["item"]): r["score"] for r in scores}
        assert by_version[(1, "word-0#0")] == 1.0 and by_version[(2, "word-0#0")] == 0.0
        metrics = httpx.get(f"http://127.0.0.1:{eval_port}/metrics").text
        assert f'claw_eval_rollbacks_total{{policy="{policy}"}} 1.0' in metrics

        # the report says what happened, and why
        report = subprocess.run(
            [sys.executable, "-m", "claw_stream", "report", "--out", str(tmp / "report")],
            env=child_env(**env, COLUMNS="400"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert report.returncode == 0, report.stdout + report.stderr
        assert "rolled back to from v2" in report.stdout  # v1's status
        assert f"rolled back from v2: {reason}" in report.stdout, report.stdout
    finally:
        if follow is not None:
            follow.terminate()
            follow.wait(timeout=30)
        gateway.stop()
