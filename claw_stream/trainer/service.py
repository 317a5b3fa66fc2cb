"""`claw-stream trainer`: consume claw.samples, step, checkpoint, publish the new weights.

Per published version: checkpoint (weights + the offsets just consumed) -> WeightEvent(updating)
-> push to every engine -> WeightEvent(ready) -> commit the offsets. A restarted trainer loads
its newest checkpoint and seeks to the offsets stored in it, so a sample is never lost (it is
after the checkpoint's offsets) and never trained twice into the surviving weights.

Under `deepspeed --num_gpus N` (or torchrun) rank 0 alone consumes, checkpoints and publishes;
it hands each batch to the other ranks, which train their share of it (`PolicyTrainer.
train_step`). While no sample comes, rank 0 sends an empty batch every IDLE_BEAT_S, so the
other ranks' wait never reaches the process group's timeout (30 minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import httpx
import torch
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from claw_stream.bus.guard import TopicGuard, TopicWrong, TopicWrongGauge, WriteGuard
from claw_stream.bus.kafka import make_consumer, make_producer, publish
from claw_stream.bus.topics import specs_for
from claw_stream.events import EventError, Sample, WeightEvent, decode_event
from claw_stream.names import adapter_name
from claw_stream.settings import Settings
from claw_stream.store import consent
from claw_stream.store.db import make_engine, make_sessionmaker, until_database_back
from claw_stream.trainer.groups import GroupGate
from claw_stream.trainer.policy import PolicyTrainer, StepMetrics, latest_checkpoint, ranks
from claw_stream.trainer.step_records import mark_untrained, record_step
from claw_stream.trainer.tenants import TenantTrainers, load_position, newest, save_position
from claw_stream.versions.checkpoints import checkpoint_dir
from claw_stream.versions.following import ServingVersionFollower
from claw_stream.versions.numbering import next_free_version
from claw_stream.versions.push import candidate_engines, push, serving_engines
from claw_stream.versions.records import record, undecided
from claw_stream.versions.serving_view import serving_view

log = logging.getLogger(__name__)
SEEN_LIMIT = 100_000


def _key(tp: TopicPartition) -> str:
    return f"{tp.topic}:{tp.partition}"


def _tp(key: str) -> TopicPartition:
    topic, partition = key.rsplit(":", 1)
    return TopicPartition(topic, int(partition))


IDLE_BEAT_S = 60.0


def _hand_out(batch: list[Sample] | None, *, receive: bool = False) -> list[Sample] | None:
    """Rank 0's batch on every rank (None: stop); the other ranks pass `receive=True`."""
    box: list[list[Sample] | None] = [None if receive else batch]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


class TrainerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.gauges = {
            name: Gauge(f"claw_trainer_{name}", help_text, registry=r)
            for name, help_text in {
                "loss": "Loss of the last step",
                "mean_reward": "Mean reward of the last batch",
                "clip_fraction": "Share of clipped tokens in the last step",
                "approx_kl": "Approximate KL between the policy before and after the step",
                "is_weight_mean": "Mean truncated importance weight",
                "is_weight_max": "Largest truncated importance weight",
                "tokens_per_s": "Training throughput of the last step",
                "step_time_s": "Duration of the last step",
                "version": "Newest published policy version",
                "tokens_per_trained": "Tokens processed per answer token trained, last step "
                "(packing a session's turns into one sequence lowers it)",
            }.items()
        }
        self.unpacked = Counter(
            "claw_trainer_unpacked_samples",
            "Samples that could not join their session's packed sequence",
            registry=r,
        )
        self.steps = Counter("claw_trainer_steps", "Optimizer steps", registry=r)
        self.withdrawn = Counter(
            "claw_trainer_samples_withdrawn",
            "Samples dropped before training: their session was switched off or forgotten",
            registry=r,
        )
        self.samples = Counter("claw_trainer_samples", "Samples trained", registry=r)
        self.flat_groups = Counter(
            "claw_trainer_flat_groups",
            "Groups not trained: their rewards were all equal (zero advantage, no signal)",
            registry=r,
        )
        self.publish = Histogram(
            "claw_trainer_publish_seconds", "Checkpoint to every engine serving it", registry=r
        )

    def observe(self, m: StepMetrics, version: int) -> None:
        for name in (
            "loss",
            "mean_reward",
            "clip_fraction",
            "approx_kl",
            "is_weight_mean",
            "is_weight_max",
        ):
            self.gauges[name].set(getattr(m, name))
        self.gauges["tokens_per_s"].set(m.tokens_per_s)
        self.gauges["step_time_s"].set(m.step_time_s)
        self.gauges["tokens_per_trained"].set(m.tokens_per_trained)
        self.unpacked.inc(m.n_unpacked)
        self.gauges["version"].set(version)
        self.steps.inc()
        self.samples.inc(m.n_samples)


class _SeekToCheckpoint(ConsumerRebalanceListener):
    def __init__(self, service: TrainerService):
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        return None

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        offsets = self.service.resume_offsets()
        for tp in assigned:
            if _key(tp) in offsets:
                self.service.consumer.seek(tp, offsets[_key(tp)])


class TrainerService(ServingVersionFollower):
    def __init__(self, settings: Settings, model_path: Path, console: Console | None = None):
        self.settings = settings
        self.config = settings.trainer
        self.console = console or Console()
        self.checkpoints = checkpoint_dir(settings)
        resume = latest_checkpoint(self.checkpoints) or self.config.init_from
        self.trainer = PolicyTrainer(model_path, self.config, resume=resume)
        self.rank, self.world = ranks()
        if resume is not None:
            self.console.print(f"resumed from {resume} (version {self.trainer.state.version})")
        # tenants' own adapters (trainer/tenants.py), trained beside the shared policy
        self.tenants = (
            TenantTrainers(settings, model_path, self.console)
            if settings.tenants.adapters
            else None
        )
        trained = (self.trainer.state.seen or []) + (
            self.tenants.trained_ids() if self.tenants else []
        )
        self.seen: OrderedDict[str, None] = OrderedDict((s, None) for s in trained)
        self.position = load_position(self.checkpoints)
        self.offsets: dict[str, int] = self.resume_offsets()
        self.groups = GroupGate(
            self.config.group_size,
            self.config.group_timeout_s,
            skip_flat=self.config.normalise == "group" and self.config.skip_flat_groups,
        )
        self.metrics = TrainerMetrics()
        self.guard = WriteGuard(TopicGuard(settings.kafka_bootstrap, specs_for(settings.topics)))
        self.metrics.registry.register(
            TopicWrongGauge("claw_trainer_topic_wrong", self.guard.guard)
        )
        if self.config.metrics_port is not None and self.rank == 0:
            start_http_server(
                self.config.metrics_port, self.config.metrics_host, registry=self.metrics.registry
            )
        self.engines = serving_engines(settings)
        self.gated = settings.serving.policy == "gated"
        # the versions built since training last started from a served one (and that one),
        # and the serving version seen last (`_follow_serving`)
        self.lineage: set[int] = {self.trainer.state.version}
        self.seen_serving: int | None = None
        self.stuck_at: int | None = None  # a version it could not go back to
        self.engines_checked = 0.0  # monotonic time of the last `_engines_in_step`
        self.consumer: AIOKafkaConsumer
        self.producer: AIOKafkaProducer
        self.http: httpx.AsyncClient

    def resume_offsets(self) -> dict[str, int]:
        """Where reading goes on: the newer of the shared checkpoint's offsets and the position
        saved after the tenants' steps (both leave nothing untrained behind)."""
        return newest(self.trainer.state.offsets, self.position)

    def _connect(self) -> None:
        """Clients bound to the running event loop."""
        settings = self.settings
        self.consumer = make_consumer(
            settings.kafka_bootstrap,
            group_id=self.config.group_id,
            max_poll_records=self.config.batch_size,
            session_timeout_ms=10_000,  # a SIGKILLed trainer is replaced quickly
            heartbeat_interval_ms=3_000,
            max_poll_interval_ms=3_600_000,  # a training step may be long
        )
        self.producer = make_producer(settings.kafka_bootstrap)
        self.http = httpx.AsyncClient(timeout=600)
        self.db = make_sessionmaker(make_engine(settings.database_url))

    async def run(self, max_steps: int | None = None) -> None:
        if self.rank != 0:
            await asyncio.to_thread(self._follow)
            return
        try:
            await self._lead(max_steps)
        finally:
            if self.world > 1:
                await asyncio.to_thread(_hand_out, None)  # the other ranks stop too

    def _follow(self) -> None:
        """Ranks above 0: train the batches rank 0 hands out, until it says stop."""
        while (batch := _hand_out(None, receive=True)) is not None:
            if batch:
                self.trainer.train_step(batch)
                self._check_ranks()

    def _check_ranks(self) -> None:
        every = self.config.check_ranks_every
        if self.world > 1 and every and self.trainer.state.step % every == 0:
            self.console.print(
                f"rank {self.rank} step {self.trainer.state.step}: "
                f"weights {self.trainer.weights_digest()[:16]}"
            )

    async def _lead(self, max_steps: int | None) -> None:
        self._connect()
        await self.guard.at_start()
        self.consumer.subscribe([self.settings.samples_topic], listener=_SeekToCheckpoint(self))
        await self.consumer.start()
        await self.producer.start()
        try:
            steps = 0
            while max_steps is None or steps < max_steps:
                batch = await self._withdraw(await self._collect())  # again: see _withdraw
                tenants_alone = False
                if batch and self.tenants is not None:  # tenants' adapters train on rank 0
                    batch = await self._train_tenants(batch)
                    tenants_alone = not batch
                if self.world > 1:  # the shared policy's samples, trained by every rank
                    await asyncio.to_thread(_hand_out, batch)
                if tenants_alone:
                    steps += 1
                    continue
                if not batch:
                    continue
                await self._follow_serving()
                metrics = await asyncio.to_thread(self.trainer.train_step, batch)
                self._check_ranks()
                for sample in batch:
                    self.seen[str(sample.sample_id)] = None
                while len(self.seen) > SEEN_LIMIT:
                    self.seen.popitem(last=False)
                steps += 1
                version = self.trainer.state.version
                if self.trainer.state.step % self.config.push_every == 0:
                    version = await self._publish_version()
                await record_step(
                    self.db,
                    self.settings.policy_name,
                    self.config.method,
                    self.trainer.state.step,
                    version,
                    metrics,
                    batch,
                )
                self.metrics.observe(metrics, version)
                self.console.print(
                    f"step {self.trainer.state.step} v{version}: loss {metrics.loss:+.4f} "
                    f"reward {metrics.mean_reward:+.3f} clip {metrics.clip_fraction:.2f} "
                    f"IS {metrics.is_weight_mean:.2f} {metrics.tokens_per_s:.0f} tok/s "
                    f"{metrics.step_time_s:.2f}s ({metrics.n_samples} samples, "
                    f"{metrics.n_groups} groups)"
                    + "".join(f" {k} {v:.4g}" for k, v in sorted(metrics.extra.items()))
                )
        finally:
            await self.consumer.stop()
            await self.producer.stop()
            await self.http.aclose()

    async def _collect(self) -> list[Sample]:
        """Up to batch_size new samples; a partial batch once max_wait_s passed. A group held
        by `trainer.group_size` joins whole once it is complete (the batch may pass
        batch_size to keep it whole)."""
        batch: list[Sample] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.max_wait_s
        idle_since = loop.time()
        while len(batch) < self.config.batch_size:
            remaining = deadline - loop.time()
            if remaining <= 0 and batch:
                break
            wait = max(remaining, 0.2)
            due = self.groups.next_due(loop.time())
            if due is not None:
                wait = min(wait, max(due, 0.05))
            await self._engines_in_step()
            records = await self.consumer.getmany(
                timeout_ms=int(wait * 1000), max_records=self.config.batch_size - len(batch)
            )
            for tp, messages in records.items():
                for message in messages:
                    self.offsets[_key(tp)] = message.offset + 1
                    try:
                        sample = decode_event(Sample, message.value)
                    except EventError as exc:
                        log.warning(
                            "skipping an invalid sample at %s@%d: %s", _key(tp), message.offset, exc
                        )
                        continue
                    if str(sample.sample_id) in self.seen:
                        continue  # redelivered: trained already
                    self.groups.add(sample, _key(tp), message.offset, loop.time())
            for sample in await self._withdraw(list(self.groups.release(loop.time()))):
                if not any(s.sample_id == sample.sample_id for s in batch):
                    batch.append(sample)
            await self._set_aside(self.groups.take_flat())
            if not records and not batch:
                if self.world > 1 and loop.time() - idle_since > IDLE_BEAT_S:
                    return []  # the other ranks hear from rank 0 now and then
                deadline = loop.time() + self.config.max_wait_s
        return batch

    async def _set_aside(self, flat: list[list[Sample]]) -> None:
        """Groups without signal are not trained: recorded as `zero_advantage`, counted, and
        never taken in again (their samples join `seen`)."""
        if not flat:
            return
        ids = [s.sample_id for group in flat for s in group]
        await mark_untrained(self.db, ids, "zero_advantage")
        self.metrics.flat_groups.inc(len(flat))
        self.seen.update((str(sample_id), None) for sample_id in ids)
        rewards = ", ".join(f"{g[0].group_id}: {len(g)} x {g[0].reward:+g}" for g in flat)
        self.console.print(f"skipped {len(flat)} group(s) with equal rewards ({rewards})")

    async def _withdraw(self, batch: list[Sample]) -> list[Sample]:
        """The batch without samples of sessions switched off or forgotten after the worker
        released them, as they arrive and as the step begins (one switched off while its
        samples waited for a full batch was trained: test_console.py). Postgres must answer:
        the step waits while it is unreachable, a minute on any other error (then fails)."""
        if not batch:
            return batch
        async for attempt in until_database_back(what="the step's withdrawal check waits"):
            with attempt:
                async with self.db.begin() as session:
                    conn = await session.connection()
                    off = await consent.untrainable(conn, {s.session_id for s in batch})
        if not off:
            return batch
        gone = [s.sample_id for s in batch if s.session_id in off]
        await mark_untrained(self.db, gone, "withdrawn")
        self.metrics.withdrawn.inc(len(gone))
        self.seen.update((str(sample_id), None) for sample_id in gone)
        self.console.print(
            f"withdrew {len(gone)} sample(s) of {len(off)} session(s) switched off or forgotten"
        )
        return [s for s in batch if s.session_id not in off]

    async def _publish_version(self) -> int:
        started = time.perf_counter()
        # after going back (a rollback, a rejection) the numbers go on past every version made
        version = await next_free_version(
            self.db, self.settings.policy_name, self.checkpoints, self.trainer.state.version
        )
        policy = self.settings.policy_name
        # a held group's samples are read again after a restart: the offsets stop before them
        offsets = self.groups.safe_offsets(self.offsets)
        folder = await asyncio.to_thread(
            self.trainer.save, self.checkpoints, version, offsets, list(self.seen)
        )
        kind: Literal["full", "lora"] = "lora" if self.config.lora else "full"
        adapter = adapter_name(policy, version) if self.config.lora else None

        def event(
            status: Literal["updating", "ready", "failed", "candidate"], error: str | None = None
        ) -> WeightEvent:
            return WeightEvent(
                policy=policy,
                version=version,
                status=status,
                kind=kind,
                checkpoint_path=str(folder),
                adapter_name=adapter,
                trainer_step=self.trainer.state.step,
                error=error,
            )

        async def announce_then_record(e: WeightEvent) -> None:
            await self._send_weight(policy, e)
            await self._record_version(e)

        # gated: loaded on the candidate engines, served once the promoter says so
        engines = candidate_engines(self.settings) if self.gated else self.engines
        if not self.gated:
            await announce_then_record(event("updating"))
        try:
            await asyncio.gather(*(self._push(url, folder, version, adapter) for url in engines))
        except Exception as exc:
            await announce_then_record(event("failed", str(exc)[:2000]))
            raise
        if self.gated:  # recorded first: the promoter only decides recorded candidates
            candidate = event("candidate")
            await self._record_version(candidate)
            await self._send_weight(policy, candidate)
        else:
            await announce_then_record(event("ready"))
        self.lineage.add(version)
        await self._commit(offsets)
        self.metrics.publish.observe(time.perf_counter() - started)
        try:
            protected = await self._protected()
        except (SQLAlchemyError, OSError) as exc:  # pruning waits: it must not guess
            log.warning("not pruning: the serving version is unknown: %s", exc)
        else:
            await asyncio.to_thread(
                self.trainer.prune, self.checkpoints, self.config.keep_checkpoints, protected
            )
        return version

    async def _commit(self, offsets: dict[str, int]) -> None:
        try:
            await self.consumer.commit(
                {_tp(key): OffsetAndMetadata(offset, "") for key, offset in offsets.items()}
            )
        except CommitFailedError as exc:  # the checkpoint holds the offsets that count
            log.warning("offsets not committed to the group: %s", exc)

    async def _train_tenants(self, batch: list[Sample]) -> list[Sample]:
        """Each tenant's samples train its own adapter, one step a tenant; the shared
        policy's are returned. Once every sample trained is in a checkpoint, the position
        moves past them."""
        assert self.tenants is not None
        shared, own = self.tenants.split(batch)
        offsets = self.groups.safe_offsets(self.offsets)
        for tenant, samples in own.items():
            await self.tenants.train(
                tenant,
                samples,
                offsets,
                self.http,
                self.db,
                self._send_weight,
                self._record_version,
            )
            self.seen.update((str(s.sample_id), None) for s in samples)
            self.metrics.steps.inc()
            self.metrics.samples.inc(len(samples))
        if own and not shared and self.trainer.state.step % self.config.push_every == 0:
            self.position = offsets
            await asyncio.to_thread(save_position, self.checkpoints, offsets)
            await self._commit(offsets)
        return shared

    async def _protected(self) -> set[int]:
        """Checkpoints pruning keeps: the serving version's and undecided candidates'."""
        async with self.db.begin() as session:
            conn = await session.connection()
            view = await serving_view(conn, self.settings.policy_name)
            return {view.serving} | await undecided(conn, self.settings.policy_name, view.serving)

    async def _send_weight(self, policy: str, event: WeightEvent) -> None:
        """Wait while the weights topic differs from its spec rather than write to it (the
        guard logs it and `claw_trainer_topic_wrong` says so): a weight event keyed by policy
        in another partition would reach the workers out of order."""
        topic = self.settings.topics.weights
        while True:
            try:
                await self.guard.before_write(topic)
                await publish(self.producer, topic, policy, event)
                return
            except TopicWrong:
                await asyncio.sleep(self.guard.guard.min_interval_s)
            except KafkaError:
                self.guard.failed()
                raise

    async def _push(self, url: str, folder: Path, version: int, adapter: str | None) -> None:
        # gated, a candidate adapter stays on the candidate engine: the promoter may be asking it
        previous = (
            adapter_name(self.settings.policy_name, version - 1)
            if adapter is not None and version > 1 and not self.gated
            else None
        )
        await push(
            self.http,
            url,
            folder,
            version,
            self.settings.resolved_admin_key(),
            adapter=adapter,
            previous_adapter=previous,
        )

    async def _record_version(self, event: WeightEvent) -> None:
        """weight_versions as the event leaves it (`versions.records.record`: the worker
        archives the same event again the same way)."""
        with contextlib.suppress(Exception):  # analytics never stop training...
            async for attempt in until_database_back(0, "a version's record waits"):
                with attempt:  # ...but wait out a Postgres restart rather than lose the record
                    async with self.db.begin() as session:
                        await record(await session.connection(), event)
