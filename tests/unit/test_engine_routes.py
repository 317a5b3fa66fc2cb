"""Engine routes alone, without a model: the handlers and routers around a fake core."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from claw_stream.dialect import OpenAIError
from claw_stream.engine import admin
from claw_stream.engine.adapters import Adapters
from claw_stream.engine.core import EngineCore
from claw_stream.engine.metrics import EngineMetrics
from claw_stream.engine.openai import api_router
from claw_stream.engine.openai.models import ModelsHandler
from claw_stream.http_errors import install_error_handlers

SERVED = "tiny"
KEY = "admin-key"
ADMIN_HEADERS = {"Authorization": f"Bearer {KEY}"}


class FakeCore:
    """Only what ModelsHandler and the admin routes read; the policy rule is EngineCore's own."""

    latest_policy_adapter = EngineCore.latest_policy_adapter

    def __init__(self, adapters: dict[str, int], version: int = 0, max_model_len: int = 64):
        self.adapters = adapters
        self.lora = Adapters(model=None, budget=None)
        self.lora.versions = adapters  # the same registry, as EngineCore's `adapters` is
        self.version = version
        self.max_model_len = max_model_len
        self.model_path = Path("/models/base")
        self.tokenizer = None  # no route here gets as far as tokenizing


def models_handler(core: FakeCore) -> ModelsHandler:
    return ModelsHandler(core, SERVED, default_max_tokens=16)


def test_served_name_means_the_newest_policy_adapter_newer_than_the_base() -> None:
    core = FakeCore({"policy@v3": 3, "policy@v7": 7, "charlie": 5}, version=5)
    models = models_handler(core)
    for name in (SERVED, None, "", "/models/base"):
        assert models.resolve(name) == "policy@v7"
    assert models.resolve("charlie") == "charlie"  # an adapter asked for by name
    assert models.resolve("policy@v3") == "policy@v3"
    core.version = 7  # base weights as new as the newest adapter: the base model serves
    assert models.resolve(SERVED) is None


def test_a_tenants_adapters_are_never_the_served_model() -> None:
    """Tenants' adapters (`alice@vN`) sit beside the policy's: the served name means the
    policy's newest only; a tenant's adapter is asked for by its whole name (the gateway
    chooses it), never by the tenant's name alone."""
    core = FakeCore({"policy@v2": 2, "alice@v9": 9, "alice@v4": 4, "bob@v1": 1})
    models = models_handler(core)
    assert models.resolve(SERVED) == "policy@v2"
    assert models.resolve("alice@v4") == "alice@v4"
    del core.adapters["policy@v2"]
    assert models.resolve(SERVED) is None  # the base model, not alice's newer adapter
    for name in ("alice", "bob", "carol"):
        with pytest.raises(OpenAIError) as missing:
            models.resolve(name)
        assert missing.value.status == 404


def test_unknown_model_is_an_openai_404() -> None:
    app = FastAPI()
    install_error_handlers(app, validation_status=400)
    app.state.models_handler = models_handler(FakeCore({"policy@v1": 1}))
    app.include_router(api_router.router)
    client = TestClient(app)
    r = client.post("/tokenize", json={"model": "ghost", "prompt": "hi"})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "The model `ghost` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    listed = client.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"], m["weight_version"]) for m in listed] == [
        (SERVED, None, 0),
        ("policy@v1", SERVED, 1),
    ]


def test_context_length_errors_name_both_lengths() -> None:
    models = models_handler(FakeCore({}, max_model_len=64))
    with pytest.raises(OpenAIError) as long_prompt:
        models.check_length(70, None)
    assert long_prompt.value.status == 400 and long_prompt.value.param == "messages"
    assert "maximum context length is 64 tokens" in long_prompt.value.message
    assert "your request has 70 input tokens" in long_prompt.value.message
    with pytest.raises(OpenAIError) as too_many:
        models.check_length(10, 60)
    assert too_many.value.param == "max_tokens"
    assert "is too large: 60" in too_many.value.message
    assert "(60 > 64 - 10)" in too_many.value.message
    assert models.check_length(10, None) == 16  # the default, when it fits
    assert models.check_length(60, None) == 4  # what is left of the context
    assert models.check_length(10, 54) == 54


@pytest.fixture
def admin_client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app, validation_status=400)
    app.state.core = FakeCore({})
    app.state.metrics = EngineMetrics()
    app.state.admin_key = KEY
    app.state.open_lora_routes = False
    app.include_router(admin.router)
    return TestClient(app)


def test_load_weights_refuses_a_wrong_admin_key(admin_client: TestClient, tmp_path: Path) -> None:
    body = {"path": str(tmp_path)}
    for headers in ({"Authorization": "Bearer wrong"}, {}):
        r = admin_client.post("/admin/load_weights", json=body, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "AuthenticationError"
        assert r.json()["error"]["message"].startswith("admin key required")
    # the body is validated before the key is checked, as when the check ran in the handler
    bad = admin_client.post(
        "/admin/load_weights", json={"path": ""}, headers={"Authorization": "Bearer wrong"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "path"
    # the right key gets through to the folder check (an empty folder: nothing to load)
    r = admin_client.post(
        "/admin/load_weights", json=body, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 404
    assert r.json()["error"]["message"] == f"no safetensors files in {tmp_path}"


def test_lora_routes_need_the_admin_key_unless_left_open(admin_client: TestClient) -> None:
    body = {"lora_name": "x", "lora_path": "/nowhere"}
    for route, payload in (("/v1/load_lora_adapter", body), ("/v1/unload_lora_adapter", body)):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = admin_client.post(route, json=payload, headers=headers)
            assert r.status_code == 401, (route, headers)
            assert r.json()["error"]["message"].startswith("admin key required")
    assert admin_client.app.state.core.adapters == {}  # nothing reached the engine core
    # vLLM's open behaviour, for clients written against it
    admin_client.app.state.open_lora_routes = True
    r = admin_client.post("/v1/unload_lora_adapter", json={"lora_name": "ghost"})
    assert r.status_code == 404


def test_unloading_an_unknown_adapter_is_a_404(admin_client: TestClient) -> None:
    r = admin_client.post(
        "/v1/unload_lora_adapter", json={"lora_name": "ghost"}, headers=ADMIN_HEADERS
    )
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The lora adapter 'ghost' cannot be found."
