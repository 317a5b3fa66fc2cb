"""The one settings object: defaults < YAML config file < environment (CLAW_*) < CLI flags."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from claw_stream.evaluation.config import EvalSettings
from claw_stream.gateway.redaction import DEFAULT_PATTERNS, RedactionError, compile_patterns
from claw_stream.names import Topics
from claw_stream.serving.config import ServingSettings
from claw_stream.trainer.config import TrainerConfig
from claw_stream.worker.config import WorkerConfig


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message says which and why."""


class EngineSettings(BaseModel):
    """The built-in engine (`claw-stream engine`); env CLAW_ENGINE__<FIELD>."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8001, ge=1, le=65535)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_batch: int = Field(default=32, ge=1)
    max_model_len: int | None = Field(default=None, ge=16)
    default_max_tokens: int = Field(default=1024, ge=1, description="When a request sets none.")
    served_model_name: str | None = Field(default=None, description="Defaults to the model name.")
    threads: int | None = Field(
        default=None, ge=1, description="torch threads; default: all cores."
    )
    open_lora_routes: bool = Field(
        default=False,
        description="Serve /v1/load_lora_adapter and /v1/unload_lora_adapter without the admin "
        "key, as vLLM does (compatibility tests only).",
    )
    prefix_cache_mb: float = Field(
        default=1024,
        ge=0,
        description="Memory for the KV states of prompt prefixes shared across requests "
        "(vLLM's automatic prefix caching); 0 turns it off. SmolLM2-135M in fp32 holds "
        "about 22k tokens in 1 GiB.",
    )


class RedactionSettings(BaseModel):
    """What the gateway redacts from a Step's text before it is published (docs/privacy.md);
    env CLAW_GATEWAY__REDACTION__<FIELD>."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    patterns: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_PATTERNS),
        description="Name -> regular expression; a match becomes [REDACTED:<name>]. Merged over "
        "the defaults (api_key, github_token, aws_access_key_id, slack_token, private_key, jwt, "
        "bearer_token, email, phone); an empty regular expression switches one off.",
    )
    redactors: list[str] = Field(
        default_factory=list,
        description="Custom redactors, 'module:function' taking and returning text (a function "
        "of the text alone: results are cached); run after the patterns.",
    )
    prompt_secrets: Literal["mask", "keep"] = Field(
        default="mask",
        description="A Step whose prompt had something redacted: mask = published with no "
        "prompt token ids and train false (archived, never judged or trained); keep = trained "
        "as it is (its prompt token ids still hold the secret).",
    )
    cache_mb: float = Field(
        default=32.0,
        ge=0,
        description="Redacted texts kept per gateway process (about a byte per character), so a "
        "prompt repeated on every call is scanned once.",
    )

    @field_validator("patterns", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        return {**DEFAULT_PATTERNS, **value} if isinstance(value, dict) else value

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: dict[str, str]) -> dict[str, str]:
        try:
            compile_patterns(value)
        except RedactionError as exc:
            raise ValueError(str(exc)) from None
        return value


class GatewaySettings(BaseModel):
    """The gateway (`claw-stream gateway`); env CLAW_GATEWAY__<FIELD>."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    backends: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8001"])
    client_key: str | None = Field(
        default=None,
        description="The key of agents that name their session by URL path, X-Session-Id or "
        "body: it acts on any session it names (session keys act only on their own). Unset: "
        "any caller without a session key counts as a client.",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Larger request bodies get 413 before they are read whole (Content-Length, "
        "or counted as they arrive).",
    )
    max_concurrent_per_key: int | None = Field(
        default=None,
        ge=1,
        description="Calls in flight per key and gateway process; more get 429 with "
        "Retry-After. None: no limit (the embedded default).",
    )
    session_idle_timeout_s: float = Field(default=3600.0, gt=0)
    join_by_prefix: bool = Field(
        default=True,
        description="A call with no session id or key joins the session whose main line its "
        "messages extend (OpenClaw sends no session id); off: each such call is a session.",
    )
    join_window_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="How long a session's main line stays joinable after its last call.",
    )
    untrained_keys: list[str] = Field(
        default_factory=list,
        description="Keys (client or session keys) whose calls are archived but never judged "
        "or trained.",
    )
    strict_keys: bool = Field(
        default=False,
        description="A session key whose session ended gets 401 (AReaL) instead of starting "
        "the next episode.",
    )
    strict_models: bool = Field(
        default=False,
        description="Answer 404 for a model name no backend serves and model_map does not map "
        "(vLLM's behaviour). Off: any such name reaches the policy, since clients send the name "
        "their own docs use (`default`, `your-model-name`, a hub id).",
    )
    model_map: dict[str, str] = Field(
        default_factory=dict,
        description="Client model name -> the name the engines serve it as (the policy, a LoRA "
        "adapter such as policy@v3); checked before anything else.",
    )
    responses_store_size: int = Field(
        default=1024,
        ge=0,
        description="Responses API: how many stored responses (store: true) each gateway process "
        "keeps for previous_response_id, oldest dropped first; 0 stores none.",
    )
    publish_timeout_s: float = Field(default=5.0, gt=0)
    archive_check: bool = Field(
        default=True,
        description="Keep each Step and session event (on disk) until the worker's archive "
        "has it, and send again what the broker acknowledged and then lost (a broker "
        "restarted without its records). Off: the broker's acknowledgement is the end.",
    )
    resend_after_s: float = Field(
        default=30.0,
        gt=0,
        description="An event not archived this long is looked for on its topic (and sent "
        "again when it is not there).",
    )
    spool_alarm_s: float = Field(
        default=60.0, gt=0, description="/healthz is degraded while a spooled event is older."
    )
    archive_alarm_s: float = Field(
        default=900.0,
        gt=0,
        description="/healthz is degraded while an event waits longer for the archive (no "
        "worker running?).",
    )
    lag_every_s: float = Field(
        default=5.0,
        ge=0,
        description="Read the pipeline's consumer lag from the broker this often, for the "
        "`claw_consumer_lag` gauge of /metrics (0: off).",
    )
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    health_interval_s: float = Field(default=5.0, gt=0)
    spool_dir: Path | None = Field(
        default=None,
        description="Default DATA_DIR/spool/gateway-PORT; each process spools in a slot of it.",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Processes sharing the port (one per core helps when the gateway is busy).",
    )
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)

    @field_validator("client_key")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None


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

    broker_host: str = "127.0.0.1"
    broker_port: int = Field(default=9092, ge=1, le=65535)
    postgres_host: str = "127.0.0.1"
    postgres_port: int = Field(default=5433, ge=1, le=65535)
    postgres_user: str = "claw"
    postgres_db: str = "claw"

    model: str = Field(
        default="smollm2-135m",
        description="Registered model name, HF folder or hub id (org/name[@revision]).",
    )
    models_dir_override: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("models_dir", "CLAW_MODELS_DIR"),
        description="Where pulled models live (default DATA_DIR/models); shareable between data dirs.",
    )
    ready_timeout_s: float = Field(default=60.0, gt=0)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)

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
