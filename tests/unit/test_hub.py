"""A Hugging Face model id (`--model acme/tiny-model`) is downloaded through huggingface_hub from
the hub at HF_ENDPOINT, here a local mirror of the hub's file layout; without the hub, one line
says so and names the local-folder option."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from claw_stream.cli import main
from claw_stream.embedded import hub
from claw_stream.embedded.downloads import ModelError
from claw_stream.embedded.models import ensure_model, resolve_model

from ..support.hub_mirror import HubMirror
from ..support.processes import free_port

REPO_ID = "acme/tiny-model"
# beside the model on the hub; none is downloaded
NOT_NEEDED = {
    "pytorch_model.bin": b"old weights",
    "consolidated.safetensors": b"another format of the weights",
    "tiny.Q4_0.gguf": b"GGUF",
    "onnx/model.onnx": b"onnx",
    "README.md": b"# tiny\n",
}


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama model with its tokenizer, sharded as large models are, plus other files."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from ..support.engine import tiny_config

    folder = tmp_path_factory.mktemp("hub") / "tiny-model"
    words = ["<unk>", "<s>", "</s>", "hello", "world", "claw", "stream"]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)
    LlamaForCausalLM(tiny_config(len(words))).save_pretrained(folder, max_shard_size="100KB")
    for name, data in NOT_NEEDED.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


@pytest.fixture
def mirror(tiny_repo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubMirror]:
    with HubMirror({REPO_ID: tiny_repo}) as served:
        online(monkeypatch, served.url)
        yield served


def online(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def one_line(exc: pytest.ExceptionInfo[ModelError]) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


def test_hub_ids_are_org_slash_name_and_not_a_path_here(tmp_path: Path) -> None:
    assert hub.is_hub_id("Qwen/Qwen3-1.7B")
    assert hub.is_hub_id("Qwen/Qwen3-1.7B@main")
    assert hub.parse_id("Qwen/Qwen3-1.7B@v1.0") == ("Qwen/Qwen3-1.7B", "v1.0")
    assert hub.parse_id("Qwen/Qwen3-1.7B") == ("Qwen/Qwen3-1.7B", None)
    for text in ("smollm2-135m", "/models/qwen", "./qwen/q", "~/q/w", "a/b/c", "a b/c", "a--b/c"):
        assert not hub.is_hub_id(text), text
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not hub.is_hub_id(str(tmp_path / "org" / "name"))


def test_a_hub_id_downloads_the_files_transformers_needs_once(
    mirror: HubMirror, tiny_repo: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with pytest.raises(ModelError, match=f"run `claw-stream models pull {REPO_ID}`"):
        resolve_model(REPO_ID, tmp_path)
    folder = ensure_model(REPO_ID, tmp_path)

    assert folder.is_relative_to(tmp_path / "hub")
    assert files(folder) == files(tiny_repo) - set(NOT_NEEDED)
    assert not any(path.endswith((".bin", ".gguf", ".onnx")) for _, path in mirror.requests)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == 7
    assert AutoTokenizer.from_pretrained(folder)("hello claw").input_ids == [3, 5]

    mirror.stop()  # the hub is gone: the cache serves the model
    assert ensure_model(REPO_ID, tmp_path) == folder
    assert resolve_model(REPO_ID, tmp_path) == folder
    assert ensure_model(f"{REPO_ID}@main", tmp_path) == folder


def test_a_revision_is_downloaded_and_an_unknown_one_is_one_line(
    mirror: HubMirror, tmp_path: Path
) -> None:
    sha = mirror.repos[REPO_ID].sha
    assert ensure_model(f"{REPO_ID}@{sha}", tmp_path).name == sha
    with pytest.raises(ModelError) as exc:
        ensure_model(f"{REPO_ID}@v9", tmp_path)
    assert "no revision 'v9' of acme/tiny-model" in one_line(exc)


def test_an_unknown_repo_is_one_line_naming_it(mirror: HubMirror, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as exc:
        ensure_model("acme/no-such-model", tmp_path)
    message = one_line(exc)
    assert "has no model acme/no-such-model" in message and mirror.url in message
    assert not (tmp_path / "hub" / "models--acme--no-such-model" / "snapshots").exists()


def test_a_gated_model_needs_hf_token(
    tiny_repo: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with HubMirror({"acme/gated-model": tiny_repo}, gated={"acme/gated-model": "hf_ok"}) as served:
        online(monkeypatch, served.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        with pytest.raises(ModelError) as exc:
            ensure_model("acme/gated-model", tmp_path)
        assert "acme/gated-model is gated" in one_line(exc) and "HF_TOKEN" in str(exc.value)
        monkeypatch.setenv("HF_TOKEN", "hf_ok")
        assert (ensure_model("acme/gated-model", tmp_path) / "config.json").is_file()


def test_an_unreachable_hub_is_one_line_naming_the_local_folder_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    online(monkeypatch, closed)
    with pytest.raises(ModelError) as exc:
        ensure_model(REPO_ID, tmp_path)
    message = one_line(exc)
    assert f"cannot reach the Hugging Face hub ({closed}) to download {REPO_ID}" in message
    assert "--model /path/to/folder" in message

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as exc:
        ensure_model(REPO_ID, tmp_path)
    message = one_line(exc)
    assert "cannot reach the Hugging Face hub" in message and "HF_HUB_OFFLINE" in message
    assert "--model /path/to/folder" in message


def test_offline_mode_still_finds_a_downloaded_model(
    mirror: HubMirror, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = ensure_model(REPO_ID, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert ensure_model(REPO_ID, tmp_path) == folder


def test_a_local_folder_is_used_as_it_is(tiny_repo: Path, tmp_path: Path) -> None:
    assert ensure_model(str(tiny_repo), tmp_path) == tiny_repo
    assert not (tmp_path / "hub").exists()


def test_models_pull_downloads_a_hub_model_into_the_data_dir(
    mirror: HubMirror, tmp_path: Path
) -> None:
    result = CliRunner().invoke(main, ["models", "pull", REPO_ID, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    folder = hub.cached(REPO_ID, tmp_path / "models")
    assert folder is not None and (folder / "config.json").is_file()
    assert REPO_ID in result.output

    missing = CliRunner().invoke(
        main, ["models", "pull", "acme/no-such-model", "--data-dir", str(tmp_path)]
    )
    assert missing.exit_code == 1 and "has no model acme/no-such-model" in missing.output
