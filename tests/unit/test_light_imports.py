"""The CLI, settings, gateway and worker start without the model side: none of them loads torch.
(`claw-stream --help` took 4.5 s when settings imported the trainer's losses; 0.3 s without;
0.12 s once the commands imported settings, pydantic and rich only when they run.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..support.processes import child_env

MODEL_SIDE = ("torch", "transformers", "deepspeed", "peft", "accelerate")


def model_side_loaded(code: str, modules: tuple[str, ...] = MODEL_SIDE) -> list[str]:
    """The model-side packages (or `modules`) a fresh interpreter has loaded after `code`."""
    probe = f"{code}\nimport sys\nprint('loaded:', *(m for m in {modules!r} if m in sys.modules))"
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
        "claw_stream.worker.app",
    ],
)
def test_importing_a_service_loads_no_torch(module: str) -> None:
    assert model_side_loaded(f"import {module}") == []


CLI_HELP = (
    "from claw_stream.cli import main\n"
    "try:\n    main(['--help'])\nexcept SystemExit as done:\n    assert done.code == 0, done.code"
)


def test_the_cli_help_loads_no_torch() -> None:
    assert model_side_loaded(CLI_HELP) == []


def test_the_cli_help_loads_click_and_the_command_modules_only() -> None:
    """Each command imports settings (pydantic), rich and the services when it runs."""
    heavy = ("claw_stream.settings", "claw_stream.names", "pydantic", "rich", "httpx", "asyncio")
    assert model_side_loaded(CLI_HELP, heavy) == []


def test_the_cli_choices_are_the_package_names() -> None:
    """The CLI spells out the training methods so as not to import names.py (pydantic) for
    --help; the agents' names come from a module that imports nothing."""
    from claw_stream import names
    from claw_stream.agents import connect
    from claw_stream.agents.names import CONNECTABLE
    from claw_stream.cli.common import METHODS

    assert METHODS == names.METHODS
    assert tuple(connect.AGENTS) == CONNECTABLE


def test_the_probe_sees_torch_where_it_is_loaded() -> None:
    assert "torch" in model_side_loaded("import claw_stream.trainer.losses")
