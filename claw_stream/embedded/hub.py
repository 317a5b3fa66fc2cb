"""Models from the Hugging Face hub, for users who can reach it: `--model Qwen/Qwen3-1.7B`.

`huggingface_hub` downloads into the hub's own cache layout under $CLAW_DATA_DIR/models/hub, so a
model downloaded once is found again without the network. It honours HF_ENDPOINT (read here at
call time, not when the library was imported), HF_TOKEN and HF_HUB_OFFLINE.
"""

from __future__ import annotations

import glob
import json
import os
import re
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress

from claw_stream.embedded.downloads import ModelError, download_progress

if TYPE_CHECKING:
    from huggingface_hub import HfApi

_ID = re.compile(r"([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@([\w./-]+))?")
DEFAULT_ENDPOINT = "https://huggingface.co"
LOCAL_FOLDER = (
    "download it where the hub is reachable and give its folder: "
    "`claw-stream up --model /path/to/folder`"
)
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_INDEX = "pytorch_model.bin.index.json"
# what transformers reads besides the weights: config, tokenizer, chat template
SMALL_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*")


def is_hub_id(text: str) -> bool:
    """`org/name` or `org/name@revision`, and no path that exists here."""
    match = _ID.fullmatch(text)
    if match is None or "--" in match[1] or ".." in match[1]:
        return False
    return not Path(text).expanduser().exists()


def parse_id(text: str) -> tuple[str, str | None]:
    """`org/name@revision` -> (`org/name`, `revision`); no `@` -> revision None (the default)."""
    repo_id, _, revision = text.partition("@")
    return repo_id, revision or None


def endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT or DEFAULT_ENDPOINT).rstrip("/")


def _offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.is_offline_mode() or flag.strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_complete(folder: Path) -> bool:
    """A config.json and every weights file its index names (or one weights file)."""
    if not (folder / "config.json").is_file():
        return False
    for index in (SAFETENSORS_INDEX, PYTORCH_INDEX):
        if (folder / index).is_file():
            shards = set(json.loads((folder / index).read_text())["weight_map"].values())
            return all((folder / shard).is_file() for shard in shards)
    return (folder / "pytorch_model.bin").is_file() or any(
        path.is_file() for path in folder.glob("*.safetensors")
    )


def cached(repo_id: str, models_dir: Path, revision: str | None = None) -> Path | None:
    """The complete snapshot downloaded earlier, found without the network; else None."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=models_dir / "hub", local_files_only=True
        )
    except (LocalEntryNotFoundError, ValueError):
        return None
    return Path(folder) if is_complete(Path(folder)) else None


def download(
    repo_id: str, models_dir: Path, console: Console | None = None, revision: str | None = None
) -> Path:
    """The model's folder in the hub cache, downloaded first (with progress) unless complete."""
    label = f"{repo_id}@{revision}" if revision else repo_id
    try:
        import httpx
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ModelError(
            f"downloading {label} needs the huggingface_hub package "
            f"(pip install huggingface_hub); or {LOCAL_FOLDER}"
        ) from None
    folder = cached(repo_id, models_dir, revision)
    if folder is not None:
        return folder
    url = endpoint()
    unreachable = f"cannot reach the Hugging Face hub ({url}) to download {label}"
    if _offline():
        raise ModelError(f"{unreachable}: offline mode is on (HF_HUB_OFFLINE); {LOCAL_FOLDER}")
    api = HfApi(endpoint=url)
    cache = models_dir / "hub"
    try:
        info = api.model_info(repo_id, revision=revision)
        files = [s.rfilename for s in info.siblings or []]
        wanted = _wanted(api, repo_id, info.sha, files, cache, label)
        with download_progress(console or Console(stderr=True)) as progress:
            path = snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=cache,
                allow_patterns=[glob.escape(f) for f in wanted],  # names, not globs
                endpoint=url,
                tqdm_class=_rich_bar(progress, f"download {label}"),
            )
    except GatedRepoError:
        raise ModelError(
            f"{label} is gated on the Hugging Face hub: accept its terms at {url}/{repo_id} "
            "and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ModelError(
            f"no folder {repo_id!r} here, and the Hugging Face hub ({url}) has no model {repo_id},"
            " or it is private (set HF_TOKEN to a token that may read it)"
        ) from None
    except RevisionNotFoundError:
        raise ModelError(
            f"the Hugging Face hub has no revision {revision!r} of {repo_id}"
        ) from None
    except HfHubHTTPError as exc:
        raise ModelError(
            f"the Hugging Face hub ({url}) answered {exc.response.status_code} for {label}; "
            f"{LOCAL_FOLDER}"
        ) from None
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, httpx.HTTPError):
        raise ModelError(f"{unreachable}; {LOCAL_FOLDER}") from None
    folder = Path(path)
    if not is_complete(folder):
        raise ModelError(f"the download of {label} in {folder} is incomplete; pull it again")
    return folder


def _wanted(
    api: HfApi, repo_id: str, sha: str | None, files: list[str], cache: Path, label: str
) -> list[str]:
    """The files transformers loads: config, tokenizer and one format of the weights
    (safetensors when there are any; never GGUF, ONNX or the other formats beside them)."""
    top = [f for f in files if "/" not in f]
    if "config.json" not in top:
        raise ModelError(f"{label} has no config.json on the hub: not a transformers model")
    small = [
        f
        for f in top
        if any(fnmatch(f, p) for p in SMALL_FILES) and f not in (SAFETENSORS_INDEX, PYTORCH_INDEX)
    ]

    def indexed(index: str) -> list[str]:
        path = api.hf_hub_download(repo_id, index, revision=sha, cache_dir=cache)
        shards = set(json.loads(Path(path).read_text())["weight_map"].values())
        return [*small, index, *sorted(shards)]

    if SAFETENSORS_INDEX in top:
        return indexed(SAFETENSORS_INDEX)
    if "model.safetensors" in top:
        return [*small, "model.safetensors"]
    if safetensors := [f for f in top if f.endswith(".safetensors")]:
        return [*small, *safetensors]
    if PYTORCH_INDEX in top:
        return indexed(PYTORCH_INDEX)
    if "pytorch_model.bin" in top:
        return [*small, "pytorch_model.bin"]
    raise ModelError(f"{label} has no safetensors or PyTorch weights on the hub")


def _rich_bar(progress: Progress, label: str) -> type[Any]:
    """A tqdm class that snapshot_download drives and rich draws: its byte total, one bar."""
    from tqdm.std import tqdm

    class RichBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            bytes_bar = kwargs.get("unit") == "B"  # the other one counts files
            super().__init__(*args, **{**kwargs, "gui": True, "disable": False})
            self._task = progress.add_task(
                label, total=self.total or None, completed=self.n, visible=bytes_bar
            )

        def display(self, *args: Any, **kwargs: Any) -> None:
            if hasattr(self, "_task"):
                progress.update(self._task, total=self.total or None, completed=self.n)

        def clear(self, *args: Any, **kwargs: Any) -> None:
            pass

        def close(self) -> None:
            self.display()
            super().close()

    return RichBar
