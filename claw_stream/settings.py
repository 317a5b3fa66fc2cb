"""The one settings object: defaults < YAML config file < environment (CLAW_*) < CLI flags."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from claw_stream.console.config import ConsoleSettings
from claw_stream.engine.config import EngineSettings
from claw_stream.evaluation.config import EvalSettings
from claw_stream.gateway.config import GatewaySettings
from claw_stream.names import Topics
from claw_stream.skills.config import SkillsSettings
from claw_stream.tenants import TenantSettings, check_tenant
from claw_stream.trainer.config import TrainerSettings
from claw_stream.versions.config import ServingSettings
from claw_stream.worker.config import WorkerSettings


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message says which and why."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CLAW_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        validate_by_name=True,  # a dump validates again (the gateway hands one to its workers)
    )

    data_dir: Path = Field(
        default=Path.home() / ".claw-stream",
        description="Logs, Postgres data, models, spool and checkpoints live here.",
    )
    kafka_bootstrap: str = Field(default="127.0.0.1:9092", description="host:port[,host:port]")
    database_url: str = Field(
        default="postgresql+asyncpg://claw@127.0.0.1:5433/claw",
        description="SQLAlchemy async URL of the analytics store.",
    )
    admin_key: str | None = Field(
        default=None,
        description="Key for admin routes; generated once into DATA_DIR/admin_key when unset.",
    )
    policy_name: str = Field(default="policy", description="Key of claw.weights events.")
    topics: Topics = Field(default_factory=Topics, description="The topic of each role.")

    broker_host: str = Field(
        default="127.0.0.1",
        description="Address the embedded broker listens on (`claw-stream up`, `claw-stream "
        "broker`); `up` points kafka_bootstrap at it.",
    )
    broker_port: int = Field(
        default=9092, ge=1, le=65535, description="Port the embedded broker listens on."
    )
    postgres_host: str = Field(
        default="127.0.0.1",
        description="Address the embedded PostgreSQL listens on (`claw-stream up`, `claw-stream "
        "postgres`); `up` points database_url at it.",
    )
    postgres_port: int = Field(
        default=5433, ge=1, le=65535, description="Port the embedded PostgreSQL listens on."
    )
    postgres_user: str = Field(
        default="claw",
        description="The user the embedded PostgreSQL is created with (no password).",
    )
    postgres_db: str = Field(
        default="claw", description="The database the embedded PostgreSQL creates and serves."
    )

    model: str = Field(
        default="smollm2-135m",
        description="Registered model name, HF folder or hub id (org/name[@revision]).",
    )
    models_dir_override: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("models_dir", "CLAW_MODELS_DIR"),
        description="Where pulled models live (default DATA_DIR/models); shareable between data dirs.",
    )
    ready_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="`claw-stream up`: seconds to wait for each service it starts to be ready "
        "before the start fails (at least 120 s for the engine, 180 s for the trainer, 60 s "
        "for the worker).",
    )
    engine: EngineSettings = Field(
        default_factory=EngineSettings, description="The built-in engine."
    )
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="The gateway.")
    trainer: TrainerSettings = Field(default_factory=TrainerSettings, description="The trainer.")
    worker: WorkerSettings = Field(
        default_factory=WorkerSettings,
        description="The worker: judging, rewards and samples (and `claw-stream replay`).",
    )
    eval: EvalSettings = Field(
        default_factory=EvalSettings,
        description="`claw-stream eval`: the tasks it plays and the held-out replay.",
    )
    serving: ServingSettings = Field(
        default_factory=ServingSettings, description="Which trained version is served."
    )
    console: ConsoleSettings = Field(
        default_factory=ConsoleSettings, description="The web console."
    )
    tenants: TenantSettings = Field(
        default_factory=TenantSettings,
        description="Whose agent a call serves, and the tenants' own adapters.",
    )
    skills: SkillsSettings = Field(
        default_factory=SkillsSettings,
        description="Lessons learned from users and added to their prompts, without training.",
    )

    @model_validator(mode="after")
    def _tenants_beside_the_policy(self) -> Settings:
        """A tenant named as the policy would share its adapters' names (`policy@vN`)."""
        for tenant in self.tenants.keys.values():
            check_tenant(tenant, self.policy_name)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls))

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def models_dir(self) -> Path:
        return self.models_dir_override or self.data_dir / "models"

    @property
    def postgres_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def samples_topic(self) -> str:
        """The topic the trainer learns from: its own setting (a replay's topic) or the live one."""
        return self.trainer.samples_topic or self.topics.samples

    def resolved_admin_key(self) -> str:
        """The configured admin key, or the one generated for this data dir (created once)."""
        if self.admin_key:
            return self.admin_key
        path = self.data_dir / "admin_key"
        if path.exists():
            return path.read_text().strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        key = "claw-admin-" + secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        return key


def load_settings(config: Path | str | None = None, **overrides: Any) -> Settings:
    """Build settings from an optional YAML file (or $CLAW_CONFIG), the environment and overrides.

    Overrides whose value is None are ignored, so CLI flags left unset do not mask the
    environment or the file.
    """
    config = config or os.environ.get("CLAW_CONFIG")
    cls: type[Settings] = Settings
    if config is not None:
        path = Path(config).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        cls = type(
            "Settings", (Settings,), {"model_config": {**Settings.model_config, "yaml_file": path}}
        )
    try:
        return cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        source = f" (config {config})" if config else ""
        raise ConfigError(f"invalid settings{source}: {problems}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {config} is not valid YAML: {exc}") from exc
