"""Tenants at the gateway: each tenant's calls are served by its own adapter (`tenant@vN`, the
newest the engines list), a tenant without one by the shared policy, and a tenant's key can
never be served another tenant's adapter nor see it listed. A real engine (the tiny alpha
model) holds two tenants' adapters trained to say recognisable words; every Step says whose
call it was and which adapter served it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from ..support.engine import ADMIN_KEY, MIXED, PROMPT, EngineProcess
from ..support.gateway import GatewayProcess, read_steps

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
BOB_KEY = "bob-team-key-1"
CHARLIE = "charlie charlie charlie"
ALPHA = "alpha alpha alpha"  # the base model: the shared policy has no adapter here


@pytest.fixture(scope="module")
def stack(broker, database, tiny_models, mixed_lora, tmp_path_factory):
    data = tmp_path_factory.mktemp("tenants")
    mixed = mixed_lora
    engine = EngineProcess(tiny_models["alpha"], data, "--served-model-name", "policy")
    for name, path in (("alice@v1", tiny_models["charlie"]), ("bob@v3", mixed)):
        r = httpx.post(
            engine.base_url + "/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": str(path)},
            headers=ADMIN,
            timeout=60,
        )
        assert r.status_code == 200, r.text
    gateway = GatewayProcess(
        broker,
        database,
        [engine.base_url],
        data,
        env={
            "CLAW_TENANTS__KEYS": f'{{"{BOB_KEY}": "bob"}}',
            "CLAW_TENANTS__FROM_AGENT_ID": "true",
            "CLAW_GATEWAY__HEALTH_INTERVAL_S": "0.5",
        },
    )
    yield engine, gateway, mixed
    gateway.stop()
    engine.stop()


def chat(
    gateway: GatewayProcess, key: str, model: str = "default", **headers: str
) -> httpx.Response:
    return httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json={"model": model, "messages": PROMPT, "temperature": 0, "max_tokens": 12},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=60,
    )


def said(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"].strip()


def start(gateway: GatewayProcess, **body: object) -> httpx.Response:
    return httpx.post(gateway.base_url + "/rl/start_session", json=body, headers=ADMIN)


def test_each_tenant_is_served_its_own_adapter_and_never_anothers(stack, broker) -> None:
    engine, gateway, mixed = stack
    try:
        _check_tenants(engine, gateway, mixed, broker)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- gateway log ---\n{gateway.log()[-3000:]}"
            f"\n--- engine log ---\n{Path(engine.log.name).read_text()[-2000:]}"
        ) from exc


def _check_tenants(engine: EngineProcess, gateway: GatewayProcess, mixed: Path, broker) -> None:
    alice = start(gateway, tenant="alice").json()
    assert alice["tenant"] == "alice"
    alice_key = alice["api_key"]
    assert said(chat(gateway, alice_key)) == CHARLIE  # alice@v1
    assert said(chat(gateway, BOB_KEY, "gpt-4o", **{"X-Session-Id": "bob-1"})) == MIXED  # bob@v3
    plain = f"plain-{uuid.uuid4().hex[:8]}"
    assert said(chat(gateway, "any-key", **{"X-Session-Id": plain})) == ALPHA  # no tenant
    carol = f"carol-{uuid.uuid4().hex[:8]}"
    # a tenant without an adapter (named by X-Agent-Id) is served by the shared policy
    agent = {"X-Session-Id": carol, "X-Agent-Id": "carol"}
    assert said(chat(gateway, "any-key", **agent)) == ALPHA

    # another tenant's adapter does not exist for alice, in her client's own API shape
    refused = chat(gateway, alice_key, "bob@v3")
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"]["message"] == "The model `bob@v3` does not exist."
    anthropic = httpx.post(
        gateway.base_url + "/v1/messages",
        json={"model": "bob@v3", "messages": PROMPT, "max_tokens": 8},
        headers={"x-api-key": alice_key, "anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert anthropic.status_code == 404, anthropic.text
    assert anthropic.json()["type"] == "error"
    assert "bob@v3" in anthropic.json()["error"]["message"]
    # nor can her key call for another tenant, nor bob's key for her
    for key, other in ((alice_key, "bob"), (BOB_KEY, "alice")):
        r = chat(gateway, key, **{"X-Agent-Id": other})
        assert r.status_code == 403, r.text
        assert "cannot call for tenant" in r.json()["error"]["message"]
    # her own adapter and the shared policy's names are hers to ask for
    assert said(chat(gateway, alice_key, "alice@v1")) == CHARLIE

    def listed(key: str) -> set[str]:
        r = httpx.get(gateway.base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return {card["id"] for card in r.json()["data"]}

    assert listed(alice_key) == {"policy", "alice@v1"}
    assert listed(BOB_KEY) == {"policy", "bob@v3"}
    assert listed("any-key") == {"policy"}
    assert listed(ADMIN_KEY) == {"policy", "alice@v1", "bob@v3"}

    # a tenant's name is checked where a session is started
    assert start(gateway, tenant="policy").status_code == 400
    assert start(gateway, tenant="no spaces!").status_code in (400, 422)

    # a newer adapter of alice's serves her next calls once the engines list it
    r = httpx.post(
        engine.base_url + "/v1/load_lora_adapter",
        json={"lora_name": "alice@v2", "lora_path": str(mixed)},
        headers=ADMIN,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 20
    while said(chat(gateway, alice_key)) != MIXED:
        assert time.monotonic() < deadline, "alice@v2 never served alice"
        time.sleep(0.3)
    assert said(chat(gateway, BOB_KEY, **{"X-Session-Id": "bob-1"})) == MIXED

    # every Step says whose call it was and which adapter served it; refusals left none
    steps = read_steps(broker, {alice["session_id"], "bob-1", plain, carol})
    seen = {(s.session_id, s.tenant, s.served_model) for s in steps}
    assert {
        (alice["session_id"], "alice", "alice@v1"),
        (alice["session_id"], "alice", "alice@v2"),
        ("bob-1", "bob", "bob@v3"),
        (plain, None, "policy"),
        (carol, "carol", "policy"),
    } == seen
    alice_steps = [s for s in steps if s.session_id == alice["session_id"]]
    # her calls: the first, the one naming alice@v1, and those until alice@v2 answered
    assert all(s.tenant == "alice" for s in alice_steps) and len(alice_steps) >= 3

    # forgetting alice takes her sessions and her adapters off the engines; bob keeps his
    forgot = httpx.post(
        gateway.base_url + "/rl/forget", json={"tenant": "alice"}, headers=ADMIN, timeout=60
    )
    assert forgot.status_code == 200, forgot.text
    assert forgot.json()["sessions"] == [alice["session_id"]]
    assert forgot.json()["removed"]["engine adapters"] == 2
    assert listed(ADMIN_KEY) == {"policy", "bob@v3"}
    assert chat(gateway, alice_key).status_code == 401  # her key went with her session
    assert said(chat(gateway, BOB_KEY, **{"X-Session-Id": "bob-1"})) == MIXED
