"""Where a version's checkpoint is (the checkpoint directory, or where weight_versions says),
and which checkpoints pruning deletes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from claw_stream.versions import ServingError

if TYPE_CHECKING:
    from claw_stream.settings import Settings


def checkpoint_dir(settings: Settings) -> Path:
    return settings.trainer.checkpoint_dir or settings.data_dir / "checkpoints"


def checkpoint_folder(settings: Settings, recorded: str | None, version: int) -> Path:
    """Checkpoint `v{version}`: where weight_versions says, else in the checkpoint directory."""
    base = checkpoint_dir(settings)
    for folder in (Path(recorded) if recorded else None, base / f"v{version}"):
        if folder is not None and any(folder.glob("*.safetensors")):
            return folder
    raise ServingError(
        f"no checkpoint of version {version} (looked in {recorded or base / f'v{version}'}): "
        f"it was never saved or was pruned (trainer.keep_checkpoints)"
    )


def prunable(versions: list[int], keep: int, protected: set[int]) -> list[int]:
    """Checkpoints to delete: all but the newest `keep` and the protected ones (the serving
    version's and undecided candidates')."""
    ordered = sorted(versions)
    return [v for v in ordered[: max(len(ordered) - keep, 0)] if v not in protected]
