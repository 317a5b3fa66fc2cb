"""docker-compose.yml declares the production stack and validates with `docker-compose config -q`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from ..support.paths import REPO

COMPOSE = REPO / "docker-compose.yml"


def test_compose_declares_kraft_kafka_postgres_and_init_jobs() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {
        "kafka",
        "postgres",
        "topics-init",
        "migrate",
        "vllm",
        "gateway",
        "worker",
        "trainer",
    } <= set(services)
    vllm = services["vllm"]
    assert "--enable-lora" in vllm["command"] and "--enable-auto-tool-choice" in vllm["command"]
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "http://vllm:8001" in services["gateway"]["command"]
    kafka = services["kafka"]["environment"]
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"]  # KRaft: no ZooKeeper anywhere
    assert not any("zookeeper" in name for name in services)
    assert kafka["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert services["topics-init"]["command"] == ["claw-stream", "topics", "apply"]
    assert services["migrate"]["command"] == ["claw-stream", "db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    worker, trainer = services["worker"], services["trainer"]
    assert worker["command"][:2] == ["claw-stream", "worker"]
    assert "${CLAW_JUDGE_URL:-http://vllm:8001/v1}" in worker["command"]  # vLLM judges
    assert worker["deploy"]["replicas"] == "${CLAW_WORKERS:-2}"
    # replicas share the partitions: none may claim a container name, a host port or a volume
    assert not {"container_name", "ports", "volumes"} & set(worker)
    assert "--lora" in trainer["command"] and "http://vllm:8001" in trainer["command"]
    assert trainer["environment"]["CLAW_TRAINER__DEVICE"] == "cuda"
    assert trainer["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    # the trainer writes adapters where vLLM loads them from
    assert "checkpoints:/data/checkpoints" in trainer["volumes"]
    assert "checkpoints:/data/checkpoints" in services["vllm"]["volumes"]
    assert (REPO / "Dockerfile").is_file()


VLLM_PINNED = "0.33.0"
DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


def vllm_list(name: str) -> set[str]:
    return set((REPO / "ops" / "vllm" / f"v{VLLM_PINNED}-{name}.txt").read_text().split())


def resolved(arg: str, env: dict[str, str]) -> str:
    return DEFAULT.sub(lambda m: env.get(m[1], m[2]), arg)


@pytest.mark.parametrize("env_file", [None, ".env.example"])
def test_vllm_flags_are_known_to_the_pinned_vllm(env_file: str | None) -> None:
    """Every flag given to vLLM exists in the pinned version's parser (ops/vllm/, generated from
    its own `make_arg_parser` by ops/vllm/extract_flags.sh), and the parsers it names exist."""
    env: dict[str, str] = {}
    if env_file:
        for line in (REPO / env_file).read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key] = value
    flags, tools, reasoning = (
        vllm_list("serve-flags"),
        vllm_list("tool-call-parsers"),
        vllm_list("reasoning-parsers"),
    )
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("vllm", "judge"):
        service = services[name]
        assert service["image"] == f"vllm/vllm-openai:v{VLLM_PINNED}"
        for arg in (resolved(a, env) for a in service["command"]):
            flag, _, value = arg.partition("=")
            assert flag in flags, f"{name}: vLLM {VLLM_PINNED} has no flag {flag}"
            if flag == "--tool-call-parser":
                assert value in tools, f"{name}: no tool-call parser {value!r}"
            if flag == "--reasoning-parser":
                assert value in reasoning, f"{name}: no reasoning parser {value!r}"
    assert services["judge"]["profiles"] == ["judge"]
    # a typo is caught: the check above is not vacuous
    assert "--enable-auto-tool-choices" not in flags and "hermes" in tools


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config_validates() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        env={**os.environ, "CLAW_ADMIN_KEY": "test-key"},
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
