"""The CLI, settings, gateway and worker start without the model side: none of them loads torch.
(`claw-stream --help` took 4.5 s when settings imported the trainer's losses; 0.3 s without.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..support.processes import child_env

MODEL_SIDE = ("torch", "transformers", "deepspeed", "peft", "accelerate")


def model_side_loaded(code: str) -> list[str]:
    """The model-side packages a fresh interpreter has loaded after running `code`."""
    probe = (
        f"{code}\nimport sys\nprint('loaded:', *(m for m in {MODEL_SIDE!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = (line for line in done.stdout.splitlines() if line.startswith("loaded:"))
    return line.split()[1:]


@pytest.mark.parametrize(
    "module",
    [
        "claw_stream.settings",
        "claw_stream.cli",
        "claw_stream.gateway.app",
        "claw_stream.processors.app",
    ],
)
def test_importing_a_service_loads_no_torch(module: str) -> None:
    assert model_side_loaded(f"import {module}") == []


def test_the_cli_help_loads_no_torch() -> None:
    code = (
        "from claw_stream.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as done:\n    assert done.code == 0, done.code"
    )
    assert model_side_loaded(code) == []


def test_the_probe_sees_torch_where_it_is_loaded() -> None:
    assert "torch" in model_side_loaded("import claw_stream.trainer.losses")
