"""The root `claw-stream` group: the commands of each group module, registered on it.

`claw-stream --help` imports click and these modules only; each command imports what it
needs (settings, rich, the services) when it runs.
"""

from __future__ import annotations

import click

from claw_stream import __version__
from claw_stream.cli.agents import COMMANDS as AGENTS
from claw_stream.cli.config import COMMANDS as CONFIG
from claw_stream.cli.data import COMMANDS as DATA
from claw_stream.cli.evaluate import COMMANDS as EVALUATE
from claw_stream.cli.models import COMMANDS as MODELS
from claw_stream.cli.services import COMMANDS as SERVICES
from claw_stream.cli.skills import COMMANDS as SKILLS
from claw_stream.cli.stack import COMMANDS as STACK
from claw_stream.cli.topics import COMMANDS as TOPICS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-stream")
def main() -> None:
    """claw-stream: learn from an agent's live conversations while it keeps serving."""


for _command in (*STACK, *SERVICES, *DATA, *SKILLS, *AGENTS, *EVALUATE, *TOPICS, *MODELS, *CONFIG):
    main.add_command(_command)
