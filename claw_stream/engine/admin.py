"""Live weights: LoRA adapters (vLLM's `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`) and a
full weight swap (`/admin/load_weights`), all behind the admin key when the engine has one:
whoever reaches the engine's port must not swap what the policy serves. vLLM leaves its LoRA
routes open; `engine.open_lora_routes` does the same here, for clients written against it.
Handlers take the engine core, metrics and admin key from `app.state`, set by
`server.create_app`."""

from __future__ import annotations

import asyncio
import hmac
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from safetensors.torch import load_file

from claw_stream.dialect import OpenAIError
from claw_stream.engine.metrics import EngineMetrics
from claw_stream.engine.openai import protocol as p
from claw_stream.names import VERSION_HEADER

if TYPE_CHECKING:
    from claw_stream.engine.core import EngineCore

router = APIRouter()


async def require_admin(raw: Request) -> None:
    """401 unless the caller sends `Authorization: Bearer <admin key>`; open when no key is set."""
    admin_key: str | None = raw.app.state.admin_key
    if admin_key is None:
        return
    header = raw.headers.get("authorization", "")
    token = header.removeprefix("Bearer ").strip()
    if not hmac.compare_digest(token.encode(), admin_key.encode()):
        raise OpenAIError(401, "admin key required (Authorization: Bearer <admin key>)")


# The key checks hang on the bodies, not on the routes, so FastAPI validates a body first: a
# malformed body is a 400 whatever the key (a route dependency runs before the body is
# validated, and would answer 401).


async def admin_weights_request(body: p.LoadWeightsRequest, raw: Request) -> p.LoadWeightsRequest:
    """The body of `/admin/load_weights`, from a holder of the admin key."""
    await require_admin(raw)
    return body


async def load_adapter_request(
    body: p.LoadLoRAAdapterRequest, raw: Request
) -> p.LoadLoRAAdapterRequest:
    if not raw.app.state.open_lora_routes:
        await require_admin(raw)
    return body


async def unload_adapter_request(
    body: p.UnloadLoRAAdapterRequest, raw: Request
) -> p.UnloadLoRAAdapterRequest:
    if not raw.app.state.open_lora_routes:
        await require_admin(raw)
    return body


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(
    body: Annotated[p.LoadLoRAAdapterRequest, Depends(load_adapter_request)], raw: Request
) -> Response:
    core: EngineCore = raw.app.state.core
    if body.lora_name in core.adapters:
        raise OpenAIError(
            400,
            f"The lora adapter '{body.lora_name}' has already been loaded.",
            param="lora_name",
        )
    if not (Path(body.lora_path) / "adapter_config.json").is_file():
        raise OpenAIError(404, f"No adapter found at {body.lora_path}", param="lora_path")
    try:
        await asyncio.wrap_future(
            core.call(lambda: core.load_adapter(body.lora_name, body.lora_path))
        )
    except (ValueError, RuntimeError, OSError) as exc:
        raise OpenAIError(400, f"cannot load adapter {body.lora_name}: {exc}") from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(
    body: Annotated[p.UnloadLoRAAdapterRequest, Depends(unload_adapter_request)], raw: Request
) -> Response:
    core: EngineCore = raw.app.state.core
    if body.lora_name not in core.adapters:
        raise OpenAIError(
            404, f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name"
        )
    await asyncio.wrap_future(core.call(lambda: core.unload_adapter(body.lora_name)))
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


@router.post("/admin/load_weights")
async def load_weights(
    body: Annotated[p.LoadWeightsRequest, Depends(admin_weights_request)], raw: Request
) -> Response:
    core: EngineCore = raw.app.state.core
    metrics: EngineMetrics = raw.app.state.metrics
    started = time.perf_counter()
    folder = Path(body.path)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise OpenAIError(404, f"no safetensors files in {folder}", param="path")
    state: dict[str, Any] = {}
    for file in files:
        state.update(await asyncio.to_thread(load_file, str(file)))

    def swap() -> int:
        version = core.version + 1 if body.version is None else body.version
        core.load_weights(state, version, rollback=body.rollback)
        return version

    try:
        version = await asyncio.wrap_future(core.call(swap))
    except ValueError as exc:
        status = 409 if "not newer" in str(exc) else 400
        raise OpenAIError(status, str(exc), param="version" if status == 409 else "path") from None
    seconds = time.perf_counter() - started
    metrics.swap.observe(seconds)
    metrics.version.set(version)
    return JSONResponse(
        {"weight_version": version, "seconds": round(seconds, 4)},
        headers={VERSION_HEADER: str(version)},
    )
