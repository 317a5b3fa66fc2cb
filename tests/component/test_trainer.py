"""The trainer: learning on a tiny model, then the whole publish cycle over the real broker,
engine and Postgres, including a SIGKILL in the middle of training."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from claw_stream.engine.chat_format import render_prompt
from claw_stream.engine.core import EngineCore, FinishEvent, GenerationParams, Request
from claw_stream.events import Sample
from claw_stream.ids import uuid7
from claw_stream.store.db import asyncpg_dsn
from claw_stream.trainer.config import TrainerSettings
from claw_stream.trainer.policy import PolicyTrainer, TrainerState, latest_checkpoint
from claw_stream.trainer.shared_base import AdapterTrainer, SharedBase

from ..support.engine import ADMIN_KEY, PROMPT, EngineProcess
from ..support.gateway import GatewayProcess
from ..support.processes import child_env
from ..support.trainer import TrainerRun, make_samples, produce, served_version, weight_events


def answer_logprob(trainer: PolicyTrainer, sample: Sample) -> float:
    ids = torch.tensor([sample.prompt_token_ids + sample.response_token_ids])
    with torch.no_grad():
        lp = torch.log_softmax(trainer.engine.module(ids).logits[0].float(), -1)
    start = len(sample.prompt_token_ids) - 1
    return sum(float(lp[start + i, t]) for i, t in enumerate(sample.response_token_ids))


def test_rewarded_answer_becomes_more_likely(tiny_models) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bravo"])
    trainer = PolicyTrainer(tiny_models["bravo"], TrainerSettings(lr=3e-3, normalise="group"))
    liked, disliked = make_samples(
        tokenizer, [("the answer is yes", 1.0), ("bravo bravo bravo", -1.0)]
    )
    before_liked, before_disliked = (
        answer_logprob(trainer, liked),
        answer_logprob(trainer, disliked),
    )
    for _ in range(4):
        metrics = trainer.train_step(
            make_samples(tokenizer, [("the answer is yes", 1.0), ("bravo bravo bravo", -1.0)], "g")
        )
        assert metrics.n_samples == 2 and metrics.n_tokens > 0
    after_liked, after_disliked = answer_logprob(trainer, liked), answer_logprob(trainer, disliked)
    assert after_liked > before_liked + 1.0
    assert after_disliked < before_disliked


def test_an_answer_sampled_with_skills_is_learnt_without_them(tiny_models) -> None:
    """Context distillation: an answer the policy gave with skills in its prompt (its log-probs
    there, the teacher's, far above the prompt's without them) trains the prompt without them.
    Sampled under that other context it gets no importance weight, where a sample of this
    prompt's own keeps its truncated one: exp(old - behaviour) would all but silence it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bravo"])
    (plain,) = make_samples(tokenizer, [("the answer is yes", 1.0)])
    confident = [-0.05] * len(plain.response_token_ids)  # the policy with the skills

    def learnt(without_skills: bool) -> tuple[float, float]:
        """How much likelier the answer became without skills, and the first step's weight."""
        trainer = PolicyTrainer(tiny_models["bravo"], TrainerSettings(lr=3e-3, method="opd"))
        sample = plain.model_copy(
            update={
                "method": "opd",
                "response_logprobs": confident,
                "teacher_logprobs": confident,
                "without_skills": without_skills,
            }
        )
        before = answer_logprob(trainer, sample)
        first = trainer.train_step([sample])
        for _ in range(3):
            trainer.train_step([sample.model_copy(update={"sample_id": uuid7()})])
        return answer_logprob(trainer, sample) - before, first.is_weight_mean

    distilled, weight = learnt(True)
    here, truncated = learnt(False)
    assert weight == pytest.approx(1.0)
    assert truncated < 0.05  # the answer was unlikely without the skills
    # measured: 28.3 nats against 3.1
    assert distilled > 4 * max(here, 0.0) and distilled > 5.0


@pytest.mark.parametrize("lora", [False, True])
def test_kl_to_the_reference_grows_as_the_policy_moves_away(tiny_models, lora: bool) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bravo"])
    config = TrainerSettings(
        lr=1e-2, kl_coef=0.1, lora=lora, lora_r=4, lora_targets=["q_proj", "v_proj"]
    )
    trainer = PolicyTrainer(tiny_models["bravo"], config)
    batch = [("the answer is yes", 1.0), ("bravo bravo bravo", -1.0)]
    first = trainer.train_step(make_samples(tokenizer, batch))
    assert first.kl_ref == pytest.approx(0.0, abs=1e-6)  # still the reference
    for _ in range(3):
        later = trainer.train_step(make_samples(tokenizer, batch))
    assert later.kl_ref > 1e-4


def test_one_step_publishes_a_version_everywhere(
    trainer_env, broker, database, tiny_models
) -> None:
    env, engine, topic, policy, tmp = trainer_env
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    produce(broker, topic, make_samples(tokenizer, [("alpha alpha alpha", 1.0), ("alpha", -1.0)]))
    assert served_version(engine) == 0
    run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer.log", "--max-steps", "1")
    assert run.proc.wait(timeout=240) == 0, run.output()
    assert served_version(engine) == 1
    events = weight_events(broker, policy)
    assert [(e.status, e.version) for e in events] == [("updating", 1), ("ready", 1)]
    assert Path(events[-1].checkpoint_path).is_dir()

    async def rows() -> tuple[list, list]:
        conn = await asyncpg.connect(asyncpg_dsn(database))
        steps = await conn.fetch(
            "SELECT step, version, n_samples, loss FROM training_steps WHERE policy = $1", policy
        )
        versions = await conn.fetch(
            "SELECT version, status FROM weight_versions WHERE policy = $1", policy
        )
        await conn.close()
        return steps, versions

    steps, versions = asyncio.run(rows())
    assert [(r["step"], r["version"], r["n_samples"]) for r in steps] == [(1, 1, 2)]
    assert [(r["version"], r["status"]) for r in versions] == [(1, "ready")]


def test_an_engine_that_restarted_is_given_the_serving_version_again(
    trainer_env, broker, tiny_models
) -> None:
    """The engine restarts (as the supervisor restarts it) and serves the model it started
    with, v0: its samples would all be stale and no step would ever push again. The running
    trainer, with no sample to train, gives it the serving v1 within a few seconds."""
    env, engine, topic, _policy, tmp = trainer_env
    env = {**env, "CLAW_TRAINER__ENGINE_CHECK_S": "1"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    produce(broker, topic, make_samples(tokenizer, [("alpha alpha alpha", 1.0), ("alpha", -1.0)]))
    run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer.log")
    restarted: EngineProcess | None = None
    try:
        deadline = time.monotonic() + 240
        while served_version(engine) != 1:
            assert run.proc.poll() is None and time.monotonic() < deadline, run.output()
            time.sleep(0.5)
        engine.stop()
        restarted = EngineProcess(
            tiny_models["alpha"], tmp, "--served-model-name", "policy", port=engine.port
        )
        deadline = time.monotonic() + 60
        while served_version(restarted) != 1:
            assert run.proc.poll() is None and time.monotonic() < deadline, run.output()
            time.sleep(0.5)
        assert "serves the model it started with" in run.output()
    finally:
        run.proc.terminate()
        run.proc.wait(timeout=60)
        if restarted is not None:
            restarted.stop()


def test_samples_of_sessions_switched_off_or_forgotten_are_withdrawn_before_training(
    trainer_env, broker, database, tiny_models
) -> None:
    """The worker released them before the user said "don't train" (or "forget"): the
    trainer drops them as they arrive, so none is trained and the batch fills with others."""
    env, _engine, topic, policy, tmp = trainer_env
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    kept = make_samples(tokenizer, [("alpha alpha", 0.5), ("alpha", -0.25)])
    off = make_samples(tokenizer, [("alpha alpha alpha", 1.0), ("alpha", 1.0)])
    gone = make_samples(tokenizer, [("alpha alpha", -1.0)])

    async def db(query: str, *args: object) -> list:
        conn = await asyncpg.connect(asyncpg_dsn(database))
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    for s in off:
        asyncio.run(
            db(
                "INSERT INTO sessions (session_id, status, train) VALUES ($1, 'active', false)",
                s.session_id,
            )
        )
    asyncio.run(
        db(
            "INSERT INTO forgotten_sessions (session_id, removed) VALUES ($1, '{}')",
            gone[0].session_id,
        )
    )
    # one partition, in this order: a trainer that meets the kept two first would train and stop
    # (--max-steps 1) before it saw the others
    produce(broker, topic, off + gone + kept, key="one-partition")
    env = {**env, "CLAW_TRAINER__MAX_WAIT_S": "30"}  # a batch of 2 waits for 2 trainable ones
    run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer.log", "--max-steps", "1")
    assert run.proc.wait(timeout=240) == 0, run.output()
    rows = asyncio.run(
        db("SELECT n_samples, mean_reward FROM training_steps WHERE policy = $1", policy)
    )
    # only the two kept samples make this batch's mean reward (0.5 - 0.25) / 2
    assert [(r["n_samples"], r["mean_reward"]) for r in rows] == [(2, 0.125)], run.output()
    withdrawn = re.findall(r"withdrew (\d+) sample", run.output())
    assert sum(int(n) for n in withdrawn) == 3, run.output()


def test_two_ranks_publish_once_and_keep_the_same_weights(trainer_env, broker, tiny_models) -> None:
    """Two ranks on CPU (gloo): rank 0 consumes and publishes once per step, both train their
    share of each batch, and their weights agree after every step; a tenant's samples train its
    adapter on rank 0, published as the tenant's."""
    env, engine, topic, policy, tmp = trainer_env
    alice = f"alice-{uuid.uuid4().hex[:6]}"
    env = {
        **env,
        "CLAW_TRAINER__BATCH_SIZE": "4",
        "CLAW_TRAINER__CHECK_RANKS_EVERY": "1",
        "CLAW_TENANTS__ADAPTERS": json.dumps([alice]),
        "CLAW_TENANTS__LORA_R": "4",
    }
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    answers = [("alpha alpha alpha", 1.0), ("alpha", -1.0), ("bravo", -1.0), ("alpha alpha", 1.0)]
    hers = [s.model_copy(update={"tenant": alice}) for s in make_samples(tokenizer, answers[:2])]
    # in this order (one key): her two and two of the policy's, then four of the policy's
    produce(broker, topic, hers + make_samples(tokenizer, answers * 2), key="in-order")
    run = TrainerRun(env, tiny_models["alpha"], tmp / "ranks.log", "--max-steps", "2", ranks=2)
    assert run.proc.wait(timeout=400) == 0, run.output()
    events = weight_events(broker, policy)
    assert [(e.status, e.version) for e in events] == [
        ("updating", 1),
        ("ready", 1),
        ("updating", 2),
        ("ready", 2),
    ]
    assert served_version(engine) == 2
    digests: dict[tuple[int, int], str] = {}
    for line in run.output().splitlines():
        if match := re.search(r"rank (\d) step (\d+): weights (\w+)", line):
            digests[int(match[1]), int(match[2])] = match[3]
    assert set(digests) == {(0, 1), (1, 1), (0, 2), (1, 2)}, run.output()[-3000:]
    assert digests[0, 1] == digests[1, 1] and digests[0, 2] == digests[1, 2]
    assert digests[0, 1] != digests[0, 2]  # they trained
    assert run.output().count("step 2 v2") == 1  # one rank reports (and published)
    assert [(e.status, e.version, e.adapter_name) for e in weight_events(broker, alice)] == [
        ("updating", 1, f"{alice}@v1"),
        ("ready", 1, f"{alice}@v1"),
    ]


def test_sigkill_mid_training_loses_no_sample_and_trains_none_twice(
    trainer_env, broker, tiny_models
) -> None:
    env, engine, topic, policy, tmp = trainer_env
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    samples = make_samples(tokenizer, [("alpha alpha alpha", 1.0), ("alpha", -1.0)] * 5)
    produce(broker, topic, samples)
    first = TrainerRun(env, tiny_models["alpha"], tmp / "trainer-1.log")
    deadline = time.monotonic() + 240
    while "step 2 " not in first.output() and time.monotonic() < deadline:
        assert first.proc.poll() is None, first.output()
        time.sleep(0.05)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    second = TrainerRun(env, tiny_models["alpha"], tmp / "trainer-2.log")
    checkpoints = tmp / "data" / "checkpoints"
    wanted = {str(s.sample_id) for s in samples}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            latest = latest_checkpoint(checkpoints)
            if latest is not None and set(TrainerState.load(latest).seen or []) >= wanted:
                break
            assert second.proc.poll() is None, second.output()
            time.sleep(0.2)
        metrics = httpx.get(f"http://127.0.0.1:{env['CLAW_TRAINER__METRICS_PORT']}/metrics").text
        assert "claw_trainer_steps_total" in metrics and "claw_trainer_loss" in metrics
    finally:
        second.proc.terminate()
        second.proc.wait(timeout=30)
    state = TrainerState.load(latest_checkpoint(checkpoints))
    assert sorted(state.seen) == sorted(wanted)  # every sample once in the surviving weights
    assert "resumed from" in second.output()
    versions = [e.version for e in weight_events(broker, policy) if e.status == "ready"]
    assert versions == sorted(set(versions)) and versions[-1] == state.version
    assert served_version(engine) == state.version


def test_lora_checkpoint_is_served_as_a_versioned_adapter(tiny_models, tmp_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    config = TrainerSettings(lora=True, lora_r=4, lora_targets=["q_proj", "v_proj"], lr=1e-2)
    trainer = PolicyTrainer(tiny_models["alpha"], config)
    for _ in range(2):
        trainer.train_step(make_samples(tokenizer, [("bravo", 1.0), ("alpha alpha alpha", -1.0)]))
    folder = trainer.save(tmp_path / "ckpt", 1, {"claw.samples:0": 2}, [])
    assert (folder / "adapter_config.json").is_file() and not (
        folder / "model.safetensors"
    ).exists()
    engine = EngineProcess(tiny_models["alpha"], tmp_path, "--served-model-name", "policy")
    try:
        r = httpx.post(
            engine.base_url + "/v1/load_lora_adapter",
            json={"lora_name": "policy@v1", "lora_path": str(folder)},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert r.status_code == 200, r.text
        answer = httpx.post(
            engine.base_url + "/v1/chat/completions",
            json={"model": "policy@v1", "messages": PROMPT, "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert answer.status_code == 200 and answer.json()["weight_version"] == 1
        served = httpx.post(  # the served name now means the newest trained version
            engine.base_url + "/v1/chat/completions",
            json={"model": "policy", "messages": PROMPT, "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert served.json()["weight_version"] == 1
        assert served.json()["choices"][0]["message"] == answer.json()["choices"][0]["message"]
    finally:
        engine.stop()
    resumed = PolicyTrainer(tiny_models["alpha"], config, resume=folder)
    assert resumed.state.version == 1 and resumed.state.offsets == {"claw.samples:0": 2}


def test_tenants_adapters_share_one_base_and_each_step_moves_its_own(tiny_models, tmp_path) -> None:
    """Two tenants' adapters on one base model in memory: a step of alice's moves her adapter
    and nothing else; her checkpoint is an adapter of its own that the engine serves with the
    logprobs the trainer computes; removed and resumed, it is the same adapter."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bravo"])
    config = TrainerSettings(
        lora=True, lora_r=4, lora_targets=["q_proj", "v_proj"], lr=1e-2, normalise="group"
    )
    base = SharedBase(tiny_models["bravo"], config)
    alice, bob = AdapterTrainer(base, "alice"), AdapterTrainer(base, "bob")
    base_weights = sum(1 for n, _ in base.model.named_parameters() if "lora_" not in n)
    plain = sum(1 for _ in AutoModelForCausalLM.from_pretrained(tiny_models["bravo"]).parameters())
    assert base_weights == plain  # one copy of the base under both adapters

    def weights(trainer: AdapterTrainer) -> dict[str, torch.Tensor]:
        return {
            n: p.detach().clone() for n, p in base.model.named_parameters() if trainer.name in n
        }

    frozen = {n: p.detach().clone() for n, p in base.model.named_parameters() if "lora_" not in n}
    bob_before = weights(bob)
    samples = make_samples(
        tokenizer, [("the answer is yes", 1.0), ("bravo bravo bravo", -1.0)], "g"
    )
    liked, disliked = samples
    before, before_disliked = answer_logprob(alice, liked), answer_logprob(alice, disliked)
    for _ in range(4):
        alice.train_step(samples)
    assert answer_logprob(alice, liked) > before + 1.0
    assert answer_logprob(alice, disliked) < before_disliked
    assert all(torch.equal(weights(bob)[n], w) for n, w in bob_before.items())
    assert all(torch.equal(p, frozen[n]) for n, p in base.model.named_parameters() if n in frozen)
    base.use("bob")
    assert answer_logprob(bob, liked) == pytest.approx(before, abs=1e-5)

    folder = alice.save(tmp_path / "alice", 1, {"claw.samples:0": 2}, [])
    assert sorted(p.name for p in folder.iterdir() if "adapter" in p.name) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    core = EngineCore(tiny_models["bravo"])
    core.start()
    try:
        core.call(lambda: core.load_adapter("alice@v1", str(folder))).result(timeout=60)
        served = asyncio.run(score(core, liked, "alice@v1"))
    finally:
        core.stop()
    base.use("alice")
    assert served == pytest.approx(answer_logprob(alice, liked), abs=1e-4)

    trained = weights(alice)
    base.remove("alice")
    assert not weights(alice)
    resumed = AdapterTrainer(base, "alice", resume=folder)
    assert resumed.state.version == 1 and resumed.state.offsets == {"claw.samples:0": 2}
    assert all(torch.equal(weights(resumed)[n], w) for n, w in trained.items())


async def score(core: EngineCore, sample: Sample, adapter: str) -> float:
    """The engine's logprob of the sample's answer, as vLLM's prompt_logprobs give it."""
    request = Request(
        GenerationParams(
            prompt_ids=sample.prompt_token_ids + sample.response_token_ids,
            max_tokens=0,
            prompt_logprobs=0,
            adapter=adapter,
        ),
        asyncio.get_running_loop(),
    )
    core.submit(request)
    finish = await request.events.get()
    assert isinstance(finish, FinishEvent) and finish.prompt_logprobs is not None, finish
    start = len(sample.prompt_token_ids)
    return sum(entry[0][1] for entry in finish.prompt_logprobs[start:] if entry is not None)


def test_a_zero3_checkpoint_holds_the_trained_weights(tiny_models, tmp_path) -> None:
    """ZeRO-3 partitions every parameter; the checkpoint the engines load must still hold the
    whole trained model (it held empty tensors before the save gathered them)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])
    batch = make_samples(tokenizer, [("bravo", 1.0), ("alpha alpha alpha", -1.0)])
    trainer = PolicyTrainer(tiny_models["alpha"], TrainerSettings(lr=1e-2, zero_stage=3))
    punished = batch[1]
    before = answer_logprob(trainer, punished)
    for _ in range(2):
        trainer.train_step(batch)
    trained = answer_logprob(trainer, punished)
    folder = trainer.save(tmp_path / "ckpt", 1, {}, [])
    weights = load_file(str(folder / "model.safetensors"))
    assert weights and all(t.numel() > 0 for t in weights.values())
    resumed = PolicyTrainer(tiny_models["alpha"], TrainerSettings(lr=1e-2), resume=folder)
    assert trained < before - 1  # it learned, so the comparison below can tell
    assert answer_logprob(resumed, punished) == pytest.approx(trained, abs=1e-3)


def test_batched_token_logprobs_equal_each_sample_alone(tiny_models) -> None:
    """Left padding, position ids and kept logits give each sample's own teacher-forced values."""
    from transformers import AutoModelForCausalLM

    from claw_stream.events import Sample
    from claw_stream.ids import uuid7
    from claw_stream.trainer.batching import collate, position_ids, token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_models["alpha"], dtype=torch.float32).eval()

    def sample(prompt: list[int], response: list[int]) -> Sample:
        return Sample(
            sample_id=uuid7(), session_id="s", step_id=uuid7(), turn_id=uuid7(), method="binary",
            prompt_token_ids=prompt, response_token_ids=response, response_logprobs=[-1.0] * len(response),
            reward=1.0, reward_source="prm", weight_version=0, released_at_version=0,
        )  # fmt: skip

    samples = [sample([5, 6, 7, 8, 9, 10], [11, 12]), sample([20, 21], [22, 23, 24, 25])]
    batch = collate(samples, pad_id=0)
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=position_ids(batch.attention_mask),
            logits_to_keep=batch.logits_to_keep,
        ).logits
        got = token_logprobs(logits, batch)
        for i, s in enumerate(samples):
            ids = torch.tensor([s.prompt_token_ids + s.response_token_ids])
            alone = torch.log_softmax(model(ids).logits[0], -1)
            n = len(s.prompt_token_ids)
            want = [float(alone[n - 1 + t, tok]) for t, tok in enumerate(s.response_token_ids)]
            assert got[i, : len(want)].tolist() == pytest.approx(want, abs=1e-4)
            assert batch.mask[i].sum().item() == len(want)


def _session_samples(n_turns: int, system: int = 40, seed: int = 0) -> list[Sample]:
    """A conversation whose every prompt extends the one before with the answer and the next
    user message (append-only history, as agents send it)."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 200, (n,), generator=g).tolist()

    prompt = ids(system)
    samples = []
    for k in range(n_turns):
        response = ids(3 + k)
        samples.append(
            Sample(
                sample_id=uuid7(),
                session_id="packed",
                step_id=uuid7(),
                turn_id=uuid7(),
                method="opd",
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=[-1.0 - 0.1 * t for t in range(len(response))],
                teacher_logprobs=[-0.5] * len(response),
                reward=float(k % 2) - 0.5,
                reward_source="prm",
                weight_version=0,
                released_at_version=0,
            )
        )
        prompt = prompt + response + ids(4)
    return samples


def test_a_packed_conversation_gives_each_answer_its_own_logprobs_loss_and_gradient(
    tiny_models,
) -> None:
    """One forward pass over the whole conversation, loss masks on each answer: the same
    log-probs, loss and gradients as one pass per turn (fp64)."""
    from transformers import AutoModelForCausalLM

    from claw_stream.trainer.batching import collate, pack_samples, position_ids, token_logprobs
    from claw_stream.trainer.config import LossConfig
    from claw_stream.trainer.losses import advantages, policy_loss

    model = AutoModelForCausalLM.from_pretrained(tiny_models["alpha"], dtype=torch.float64)
    samples = _session_samples(5)
    packs, unpacked = pack_samples(samples)
    assert len(packs) == 1 and unpacked == 0 and len(packs[0].members) == 5
    loss_config = LossConfig(method="combine")

    def run(rows: list) -> tuple[torch.Tensor, float, dict[str, torch.Tensor]]:
        model.zero_grad()
        batch = collate(rows, pad_id=0)
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=position_ids(batch.attention_mask),
            logits_to_keep=batch.logits_to_keep,
        ).logits
        new = token_logprobs(logits, batch)
        adv = advantages(loss_config, batch.rewards.double(), new.detach(), batch.teacher.double())
        out = policy_loss(loss_config, new, new.detach(), batch.behaviour.double(), adv, batch.mask)
        out.loss.backward()
        order = {s.sample_id: i for i, s in enumerate(batch.samples)}
        new = (
            new[[order[s.sample_id] for s in samples]]
            * batch.mask[[order[s.sample_id] for s in samples]]
        )
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return new.detach(), float(out.loss.detach()), grads

    packed, packed_loss, packed_grads = run(packs)
    alone, alone_loss, alone_grads = run(samples)  # one row per turn
    assert packed.shape == alone.shape
    assert torch.allclose(packed, alone, atol=1e-9)
    assert packed_loss == pytest.approx(alone_loss, abs=1e-9)
    assert packed_grads.keys() == alone_grads.keys()
    for name, grad in packed_grads.items():
        assert torch.allclose(grad, alone_grads[name], atol=1e-9), name
    # the packed pass processed the conversation once
    assert collate(packs, 0).n_tokens == len(packs[0].ids)
    assert collate(samples, 0).n_tokens > 3 * len(packs[0].ids)


def test_each_tenant_trains_its_own_adapter_never_mixed_and_resumes(
    trainer_env, broker, database, tiny_models
) -> None:
    """Two tenants with adapters of their own and the shared policy in one batch: three steps,
    each on its own samples only, each published where it belongs (`alice@v1` and `bob@v1` on
    the engine, the shared policy's full weights v1). A restarted trainer resumes a tenant's
    adapter from its checkpoint and goes on numbering its versions; the version two back is
    unloaded, the one before stays while gateways may still name it."""
    env, engine, topic, policy, tmp = trainer_env
    tag = uuid.uuid4().hex[:6]
    alice, bob = f"alice-{tag}", f"bob-{tag}"
    env = {
        **env,
        "CLAW_TENANTS__ADAPTERS": json.dumps([alice, bob]),
        "CLAW_TENANTS__LORA_R": "4",
        "CLAW_TRAINER__BATCH_SIZE": "6",
        "CLAW_TRAINER__MAX_WAIT_S": "3",
    }
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["alpha"])

    def of(tenant: str | None, answers: list[tuple[str, float]]) -> list[Sample]:
        return [s.model_copy(update={"tenant": tenant}) for s in make_samples(tokenizer, answers)]

    produce(
        broker,
        topic,
        # opposite tastes: alice likes the long answer, bob the short one
        of(alice, [("charlie charlie charlie", 1.0), ("charlie", -1.0)])
        + of(bob, [("charlie", 1.0), ("charlie charlie charlie", -1.0), ("charlie", 0.5)])
        + of(None, [("alpha alpha", 1.0)]),
    )
    run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer.log", "--max-steps", "1")
    assert run.proc.wait(timeout=300) == 0, run.output()

    async def steps() -> dict[str, list[tuple[int, int, int]]]:
        conn = await asyncpg.connect(asyncpg_dsn(database))
        rows = await conn.fetch(
            "SELECT policy, step, version, n_samples FROM training_steps"
            " WHERE policy = ANY($1::text[]) ORDER BY policy, step",
            [alice, bob, policy],
        )
        await conn.close()
        out: dict[str, list[tuple[int, int, int]]] = {}
        for r in rows:
            out.setdefault(r["policy"], []).append((r["step"], r["version"], r["n_samples"]))
        return out

    # one step each, of its own samples only
    assert asyncio.run(steps()) == {
        alice: [(1, 1, 2)],
        bob: [(1, 1, 3)],
        policy: [(1, 1, 1)],
    }, run.output()
    for tenant in (alice, bob):
        events = weight_events(broker, tenant)
        assert [(e.status, e.version, e.kind, e.adapter_name) for e in events] == [
            ("updating", 1, "lora", f"{tenant}@v1"),
            ("ready", 1, "lora", f"{tenant}@v1"),
        ]
        assert (Path(events[-1].checkpoint_path) / "adapter_config.json").is_file()
    assert [e.kind for e in weight_events(broker, policy)] == ["full", "full"]

    # each adapter moved its own tenant's way: the long answer against the short one, likelier
    # for alice's, less likely for bob's
    base = AutoModelForCausalLM.from_pretrained(tiny_models["alpha"]).eval()
    prompt = render_prompt(tokenizer, PROMPT, None, None)

    def logprob(model: torch.nn.Module, text: str) -> float:
        # as the samples end: with EOS, where "charlie" alone and the long answer part
        answer = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([prompt + answer])).logits[0].float(), -1)
        return sum(float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(answer))

    def long_over_short(model: torch.nn.Module) -> float:
        return logprob(model, "charlie charlie charlie") - logprob(model, "charlie")

    before = long_over_short(base)
    moved = {}
    for tenant in (alice, bob):
        folder = tmp / "data" / "checkpoints" / "tenants" / tenant / "v1"
        adapted = PeftModel.from_pretrained(base, folder).eval()
        moved[tenant] = long_over_short(adapted) - before
        base = adapted.unload()  # the plain model again for the next tenant
    assert moved[alice] > 0 > moved[bob], moved

    def served() -> set[str]:
        return {m["id"] for m in httpx.get(engine.base_url + "/v1/models").json()["data"]}

    assert {f"{alice}@v1", f"{bob}@v1"} <= served()
    answer = httpx.post(
        engine.base_url + "/v1/chat/completions",
        json={"model": f"{alice}@v1", "messages": PROMPT, "max_tokens": 4},
        timeout=60,
    )
    assert answer.status_code == 200 and answer.json()["weight_version"] == 1

    # restarted twice, with alice's samples alone: her adapter goes on from its checkpoint
    for n in (2, 3):
        produce(broker, topic, of(alice, [("charlie", 1.0), ("alpha alpha", -1.0)]))
        run = TrainerRun(env, tiny_models["alpha"], tmp / f"trainer-{n}.log", "--max-steps", "1")
        assert run.proc.wait(timeout=300) == 0, run.output()
        assert f"tenant {alice}: its own adapter (rank 4), resumed from" in run.output()
    assert asyncio.run(steps())[alice] == [(1, 1, 2), (2, 2, 2), (3, 3, 2)]
    assert asyncio.run(steps())[policy] == [(1, 1, 1)]  # untouched by her samples
    models = served()
    assert {f"{alice}@v2", f"{alice}@v3"} <= models and f"{alice}@v1" not in models
    # a pass of tenants' samples alone moved the place reading resumes from past them
    position = json.loads((tmp / "data" / "checkpoints" / "position.json").read_text())
    assert sum(position.values()) == 10  # every sample produced: 6, then 2 and 2

    # `rollback --tenant`: her v1 is served again, her newer adapters leave the engine, and
    # her next step goes on from v1 as v4
    roll = subprocess.run(
        [sys.executable, "-m", "claw_stream", "rollback", "--tenant", alice, "--to", "1"],
        env=child_env(**env, COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert roll.returncode == 0, roll.stdout + roll.stderr
    assert f"{alice}: serving v1 (was v3)" in roll.stdout
    assert {m for m in served() if m.startswith(f"{alice}@")} == {f"{alice}@v1"}
    last = weight_events(broker, alice)[-1]
    assert (last.status, last.version, last.rolled_back_from) == ("ready", 1, 3)
    produce(broker, topic, of(alice, [("charlie", 1.0), ("alpha alpha", -1.0)]))
    run = TrainerRun(env, tiny_models["alpha"], tmp / "trainer-rolled.log", "--max-steps", "1")
    assert run.proc.wait(timeout=300) == 0, run.output()
    assert f"tenant {alice}: serving is v1, goes on from it (was v3)" in run.output()
    assert asyncio.run(steps())[alice][-1] == (4, 4, 2)
    assert f"{alice}@v4" in served()

    # the engine restarts with the model it started with: the trainer gives it every
    # tenant's serving adapter again (else the gateway serves them the shared policy)
    engine.stop()
    restarted = EngineProcess(
        tiny_models["alpha"], tmp, "--served-model-name", "policy", port=engine.port
    )
    run = TrainerRun(
        {**env, "CLAW_TRAINER__ENGINE_CHECK_S": "1"}, tiny_models["alpha"], tmp / "trainer-4.log"
    )
    gateway: GatewayProcess | None = None
    try:
        deadline = time.monotonic() + 120
        while not {f"{alice}@v4", f"{bob}@v1"} <= served():
            assert run.proc.poll() is None and time.monotonic() < deadline, run.output()
            time.sleep(0.5)

        # `forget --tenant`: her adapters leave the engines at once, her checkpoints the
        # trainer's disk at its next check, her versions Postgres; bob's stay
        gateway = GatewayProcess(broker, database, [engine.base_url], tmp)
        forgot = httpx.post(
            gateway.base_url + "/rl/forget",
            json={"tenant": alice},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=60,
        )
        assert forgot.status_code == 200, forgot.text
        assert forgot.json()["removed"]["weight_versions"] == 4  # v1 to v4
        mine = tmp / "data" / "checkpoints" / "tenants" / alice
        deadline = time.monotonic() + 60
        while mine.exists():
            assert run.proc.poll() is None and time.monotonic() < deadline, run.output()
            time.sleep(0.5)
        assert not any(m.startswith(f"{alice}@") for m in served())
        assert f"{bob}@v1" in served()
        assert (tmp / "data" / "checkpoints" / "tenants" / bob / "v1").is_dir()
        assert f"tenant {alice} forgotten" in run.output()
        assert alice not in asyncio.run(steps()) and bob in asyncio.run(steps())
    finally:
        run.proc.terminate()
        run.proc.wait(timeout=60)
        restarted.stop()
        if gateway is not None:
            gateway.stop()
