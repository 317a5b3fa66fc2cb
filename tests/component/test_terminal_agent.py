"""The terminal agent through a real gateway and engine: a tiny model trained to run a
command for each file task. Its commands run in the episode's scratch directory, a task done
there is rewarded +1 by the file checker, and a command that tries to write outside is
refused: nothing appears outside the scratch directory."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from claw_stream.tasks.checkers import FAIL, PASS
from claw_stream.tasks.dataset import load_tasks
from claw_stream.tasks.runner import TERMINAL_SYSTEM, TERMINAL_TOOL, RunOptions, run_tasks

from ..support.engine import ADMIN_KEY, EngineProcess, tiny_config, train_to_say
from ..support.gateway import GatewayProcess, read_session_events
from ..support.model_cache import built

ESCAPE = {
    "id": "escape",
    "prompt": "Leave a note next to your working directory.",
    "checker": {"kind": "file", "path": "note.txt", "contains": "hi"},
}
COMMANDS = {"files-create": "echo hello > hello.txt", "escape": "echo hi > ../../escape.txt"}


def tool_call(command: str) -> str:
    arguments = json.dumps({"command": command})
    return f'<tool_call>{{"name": "run", "arguments": {arguments}}}</tool_call>'


def build_terminal_model(folder: Path, smollm2: Path) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    examples = []
    for task_id, command in COMMANDS.items():
        prompt = ESCAPE["prompt"] if task_id == "escape" else load_tasks("files")[0].prompt
        messages = [
            {"role": "system", "content": TERMINAL_SYSTEM},
            {"role": "user", "content": prompt},
        ]
        examples.append((messages, tool_call(command)))
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(len(tokenizer)))
    loss = train_to_say(model, tokenizer, examples, tools=[TERMINAL_TOOL])
    assert loss < 0.05, loss
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def terminal_model(smollm2: Path) -> Path:
    return built("terminal", build_terminal_model, smollm2)


def test_terminal_episodes_run_in_their_scratch_directory_only(
    broker: str, database: str, terminal_model: Path, tmp_path: Path
) -> None:
    tasks_file = tmp_path / "tasks.jsonl"
    create = load_tasks("files")[0]
    assert create.id == "files-create"
    tasks_file.write_text(create.model_dump_json() + "\n" + json.dumps(ESCAPE) + "\n")
    engine = EngineProcess(terminal_model, tmp_path, "--served-model-name", "policy")
    gateway = GatewayProcess(broker, database, [engine.base_url], tmp_path)
    try:
        opts = RunOptions(
            agent="terminal",
            group_size=2,
            max_turns=2,
            max_tokens=48,
            temperature=0.0,
            scratch_dir=tmp_path / "scratch",
        )
        report = asyncio.run(
            run_tasks(gateway.base_url, ADMIN_KEY, load_tasks(str(tasks_file)), opts)
        )
    finally:
        gateway.stop()
        engine.stop()
    by_task = {t: [e for e in report.episodes if e.task_id == t] for t in COMMANDS}
    assert [e.error for e in report.episodes] == [None] * 4
    assert all(e.tool_calls >= 1 for e in report.episodes)
    assert [e.reward for e in by_task["files-create"]] == [PASS, PASS]
    assert [e.reward for e in by_task["escape"]] == [FAIL, FAIL]
    # the refused write left nothing anywhere, and the scratch directories are gone
    assert not list(tmp_path.rglob("escape.txt"))
    assert not list((tmp_path / "scratch").rglob("*.txt"))
    # each episode ended with the checker's reward, in its task's group
    sessions = {e.session_id for e in report.episodes}
    events = read_session_events(broker, sessions)
    rewards = {(e.session_id, e.reward) for e in events if e.kind == "reward"}
    assert rewards == {(e.session_id, e.reward) for e in report.episodes}
    assert {e.session_id for e in events if e.kind == "ended"} == sessions
