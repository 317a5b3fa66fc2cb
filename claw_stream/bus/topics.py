"""Topic specs (`topics/*.yaml`, the single source) and an idempotent `apply` with drift report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, for_code
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from claw_stream.events import EVENT_TYPES
from claw_stream.names import DEFAULT_TOPICS, Topics
from claw_stream.resources import topics_dir


class TopicSpecError(ValueError):
    pass


class TopicSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")
    description: str
    partitions: int = Field(ge=1)
    replication_factor: int = Field(ge=1)
    retention_ms: int = Field(ge=-1)
    cleanup_policy: Literal["delete", "compact", "compact,delete"]
    key: str
    value: str

    @field_validator("value")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in EVENT_TYPES:
            raise ValueError(f"unknown value model {value!r}; known: {sorted(EVENT_TYPES)}")
        return value

    def configs(self) -> dict[str, str]:
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy}


def load_specs(directory: Path | None = None) -> list[TopicSpec]:
    directory = directory or topics_dir()
    specs = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            spec = TopicSpec.model_validate(yaml.safe_load(path.read_text()))
        except (yaml.YAMLError, ValidationError) as exc:
            raise TopicSpecError(f"{path}: {exc}") from exc
        if spec.name != path.stem:
            raise TopicSpecError(f"{path}: name {spec.name!r} differs from the file name")
        specs.append(spec)
    if not specs:
        raise TopicSpecError(f"no topic specs in {directory}")
    return specs


def specs_for(topics: Topics, directory: Path | None = None) -> list[TopicSpec]:
    """The spec of each role's topic under the name the settings give it (the spec files hold
    each role under its default name)."""
    by_default_name = {spec.name: spec for spec in load_specs(directory)}
    specs = []
    for role, name in topics.by_role().items():
        spec = by_default_name[DEFAULT_TOPICS.by_role()[role]]
        specs.append(spec if spec.name == name else spec.model_copy(update={"name": name}))
    return specs


@dataclass
class TopicReport:
    topic: str
    action: Literal["created", "ok", "drift", "missing"]
    drift: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


async def _describe_configs(
    admin: AIOKafkaAdminClient, topics: list[str]
) -> dict[str, dict[str, str]]:
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics]
    out: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for error_code, _msg, _type, name, entries in response.resources:
            if error_code == 0:
                out[name] = {entry[0]: entry[1] for entry in entries}
    return out


async def apply_topics(
    bootstrap: str,
    specs: list[TopicSpec] | None = None,
    *,
    request_timeout_ms: int = 10_000,
    create: bool = True,
) -> list[TopicReport]:
    """Create missing topics (with `create`; else report them 'missing'); report (never change)
    partitions, replication or configs that differ."""
    specs = specs or load_specs()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        brokers = max(1, len(cluster.get("brokers", [])))
        existing = set(await admin.list_topics())
        reports: dict[str, TopicReport] = {}
        to_create: list[NewTopic] = []
        for spec in specs:
            if spec.name in existing:
                reports[spec.name] = TopicReport(spec.name, "ok")
                continue
            if not create:
                reports[spec.name] = TopicReport(spec.name, "missing")
                continue
            replication = min(spec.replication_factor, brokers)
            report = TopicReport(spec.name, "created")
            if replication < spec.replication_factor:
                report.notes.append(
                    f"replication {replication} (spec {spec.replication_factor}, {brokers} broker(s))"
                )
            reports[spec.name] = report
            to_create.append(
                NewTopic(spec.name, spec.partitions, replication, topic_configs=spec.configs())
            )
        if to_create:
            response = await admin.create_topics(to_create)
            for name, code, message in response.topic_errors:
                error = for_code(code)
                if code == 0 or error is TopicAlreadyExistsError:  # a concurrent apply won the race
                    continue
                raise RuntimeError(f"creating topic {name} failed: {error.__name__}: {message}")
        present = [s for s in specs if reports[s.name].action == "ok"]
        described = await admin.describe_topics([s.name for s in present]) if present else []
        by_name = {d["topic"]: d for d in described}
        configs = await _describe_configs(admin, [s.name for s in present])
        for spec in present:
            report = reports[spec.name]
            partitions = by_name.get(spec.name, {}).get("partitions", [])
            if len(partitions) != spec.partitions:
                report.drift.append(f"partitions {len(partitions)} (spec {spec.partitions})")
            replicas = min((len(p["replicas"]) for p in partitions), default=0)
            wanted = min(spec.replication_factor, brokers)
            if partitions and replicas < wanted:
                report.drift.append(f"replication {replicas} (spec {wanted})")
            actual = configs.get(spec.name)
            if actual is None:
                report.notes.append("broker did not describe configs")
            else:
                for key, value in spec.configs().items():
                    if key in actual and actual[key] != value:
                        report.drift.append(f"{key} {actual[key]} (spec {value})")
            if report.drift:
                report.action = "drift"
        return [reports[s.name] for s in specs]
    finally:
        await admin.close()
