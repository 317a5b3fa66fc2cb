"""Models the tests build (tiny models trained to say something, adapters, a reward model),
built once into the test cache and kept there, keyed by the code that builds them.

A key is a digest of the builder's module source, the helpers it trains with
(tests/support/engine.py), the versions of torch and transformers, and the builder's
arguments: change any of them and the model is built again. Builds take a file lock, so the
test processes of one run (pytest-xdist) build each model once and share it."""

from __future__ import annotations

import hashlib
import inspect
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from .paths import CACHE

BUILT = CACHE / "built"
DONE = ".built"  # written last: a folder without it is a build that did not finish


def _digest(build: Callable[..., Any], args: tuple[Any, ...]) -> str:
    import torch
    import transformers

    from . import engine

    h = hashlib.sha256()
    for module in sorted({inspect.getmodule(build), engine}, key=lambda m: m.__name__):  # type: ignore[union-attr]
        h.update(inspect.getsource(module).encode())  # type: ignore[arg-type]
    h.update(f"{torch.__version__} {transformers.__version__} {sys.version_info[:2]}".encode())
    h.update(repr([str(a) if isinstance(a, Path) else a for a in args]).encode())
    return h.hexdigest()[:16]


def built(name: str, build: Callable[..., Any], *args: Any) -> Path:
    """`build(folder, *args)` run once into the test cache; the folder it filled."""
    folder = BUILT / f"{name}-{_digest(build, args)}"
    if (folder / DONE).is_file():
        return folder
    BUILT.mkdir(parents=True, exist_ok=True)
    with FileLock(str(BUILT / f"{name}.lock")):
        if not (folder / DONE).is_file():  # else another test process built it meanwhile
            shutil.rmtree(folder, ignore_errors=True)  # a build that did not finish
            build(folder, *args)  # in place: an adapter's config names its base's folder
            (folder / DONE).write_text(name)
    return folder


def smollm2() -> Path:
    """SmolLM2-135M-Instruct, pulled once into the test cache (by one test process at a time)."""
    from claw_stream.embedded.models import pull

    (CACHE / "models").mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / "models" / ".pull.lock")):
        return pull("smollm2-135m", CACHE / "models")


def tiny_models(smollm2: Path) -> Path:
    """The folder of tiny Llama models trained to say recognisable things (SmolLM2's tokenizer)."""
    from .engine import build_tiny_models  # torch: only where used

    return built("tiny-models", build_tiny_models, smollm2)
