"""The `claw-stream` command: thin wrappers that load settings and call into the package.

One module per command group (stack, services, data, agents, evaluate, topics, models,
config), assembled by `main.py`; the helpers they share are in `common.py`.
"""

from claw_stream.cli.main import main

__all__ = ["main"]
