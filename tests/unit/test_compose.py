"""docker-compose.yml declares the production stack and validates with `docker-compose config -q`."""

from __future__ import annotations

import os
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
    assert "--enable-lora" in vllm["command"]
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
    assert "http://vllm:8001/v1" in worker["command"]  # vLLM judges
    assert "replicas" in worker["deploy"]
    assert "--lora" in trainer["command"] and "http://vllm:8001" in trainer["command"]
    assert trainer["environment"]["CLAW_TRAINER__DEVICE"] == "cuda"
    assert trainer["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    # the trainer writes adapters where vLLM loads them from
    assert "checkpoints:/data/checkpoints" in trainer["volumes"]
    assert "checkpoints:/data/checkpoints" in services["vllm"]["volumes"]
    assert (REPO / "Dockerfile").is_file()


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
