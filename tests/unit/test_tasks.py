"""The tasks package without services: datasets, the calculator tool, checkers, the sandbox."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from claw_stream.tasks.checkers import FAIL, PASS, score
from claw_stream.tasks.dataset import SHIPPED, DatasetError, Task, load_tasks
from claw_stream.tasks.sandbox import Sandbox
from claw_stream.tasks.toolbox import calculator
from claw_stream.tasks.tools import ToolError, tool_of


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_datasets_load(name: str) -> None:
    tasks = load_tasks(name)
    assert len(tasks) >= 8 and len({t.id for t in tasks}) == len(tasks)


def test_arithmetic_expected_answers_are_what_the_calculator_says() -> None:
    for task in load_tasks("arithmetic"):
        expression = task.prompt.removeprefix("What is ").split("?")[0]
        assert calculator(expression) == task.expected, task.id


def test_a_stated_output_format_is_checked_by_its_length_and_its_subject() -> None:
    checker = {"kind": "words", "min_words": 3, "max_words": 5}
    task = Task.model_validate(
        {
            "id": "b",
            "prompt": "What is rain? In 3 to 5 words.",
            "expected": "rain",
            "checker": checker,
        }
    )
    assert score(task, "Rain  is falling\nwater.") == PASS
    assert score(task, "Rain is water that falls.") == PASS
    assert score(task, "Rain is water falling from clouds.") == FAIL  # too long
    assert score(task, "Rain falls.") == FAIL  # too short
    assert score(task, "Water falling from clouds.") == FAIL  # says nothing of the subject
    assert score(task, "Sakura? Sakura? Sakura?") == FAIL  # brief, and nothing
    free = Task.model_validate(
        {"id": "f", "prompt": "p", "checker": {"kind": "words", "max_words": 2}}
    )
    assert score(free, "Any two.") == PASS and score(free, "   ") == FAIL
    with pytest.raises(ValueError, match="max_words"):
        Task.model_validate({"id": "b", "prompt": "p", "checker": {"kind": "words"}})
    with pytest.raises(ValueError, match="min_words is more than max_words"):
        Task.model_validate(
            {"id": "b", "prompt": "p", "checker": {"kind": "words", "min_words": 3, "max_words": 2}}
        )


def test_the_brief_tasks_and_their_held_out_set_never_share_a_question() -> None:
    train, held = load_tasks("brief"), load_tasks("brief-heldout")
    assert len(train) == 40 and len(held) == 20
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    for task in train + held:
        assert task.prompt.endswith("Answer in one sentence of at most 12 words."), task.id
        assert task.expected and task.expected.casefold() in task.prompt.casefold(), task.id


def test_a_bad_dataset_line_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"id": "a", "prompt": "2+2?", "expected": "4", "checker": {"kind": "number"}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"id": "b", "prompt": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: .*needs `expected`"):
        load_tasks(str(path))
    path.write_text("{not json\n")
    with pytest.raises(DatasetError, match=r"bad.jsonl:1: not JSON"):
        load_tasks(str(path))
    escape = {"id": "c", "prompt": "x", "checker": {"kind": "file", "path": "../etc/passwd"}}
    path.write_text(json.dumps(escape) + "\n")
    with pytest.raises(DatasetError, match="inside the scratch directory"):
        load_tasks(str(path))
    with pytest.raises(DatasetError, match="no dataset"):
        load_tasks(str(tmp_path / "missing.jsonl"))


def test_calculator_tool_schema_and_calls() -> None:
    tool = tool_of("claw_stream.tasks.toolbox:calculator")
    params = tool.schema["function"]["parameters"]
    assert tool.name == "calculator" and params["required"] == ["expression"]
    assert asyncio.run(tool.call('{"expression": "(17 + 25) * 3"}')) == "126"
    assert asyncio.run(tool.call('{"expression": "__import__(\\"os\\")"}')).startswith("error:")
    assert asyncio.run(tool.call('{"expr": "1"}')).startswith("error: bad arguments")
    assert asyncio.run(tool.call("not json")).startswith("error: bad arguments")
    with pytest.raises(ToolError, match="cannot import"):
        tool_of("claw_stream.tasks.toolbox:nothing_here")


def test_checkers_pass_and_fail() -> None:
    number = Task(id="n", prompt="?", expected="1234", checker={"kind": "number"})
    assert score(number, "The answer is 1,234.") == PASS
    assert score(number, "About 1235") == FAIL
    assert score(number, "no idea") == FAIL
    exact = Task(id="e", prompt="?", expected="Paris")
    assert score(exact, " paris ") == PASS and score(exact, "Paris, France") == FAIL


def _credited() -> Task:
    return Task.model_validate(
        {
            "id": "c",
            "prompt": "What is 39 + 12?",
            "tools": ["claw_stream.tasks.toolbox:calculator"],
            "expected": "51",
            "checker": {"kind": "number"},
            "credit": {
                "well_formed": 0.25,
                "tool": 0.25,
                "arguments": 0.25,
                "call": {"name": "calculator", "arguments": {"expression": "39 + 12"}},
            },
        }
    )


def test_partial_credit_rewards_each_step_towards_the_answer() -> None:
    task = _credited()
    right_call = [("calculator", '{"expression": "39+12"}')]  # spaces do not matter
    assert score(task, "51", calls=right_call) == PASS  # every step and the answer
    assert score(task, "I do not know") == FAIL  # nothing right
    assert score(task, "50", calls=[("calculator", "not json")]) == FAIL  # a broken call
    # a well-formed call of another tool: a quarter of the way (-1 + 2 x 0.25)
    assert score(task, "50", calls=[("search", '{"q": "39 + 12"}')]) == pytest.approx(-0.5)
    # the right tool, wrong arguments: half
    assert score(task, "50", calls=[("calculator", '{"expression": "39 - 12"}')]) == 0.0
    # the right call, then a wrong answer: three quarters
    assert score(task, "50", calls=right_call) == pytest.approx(0.5)
    # the right answer without the tool: the answer's quarter
    assert score(task, "51") == pytest.approx(-0.5)


def test_partial_credit_is_checked_when_the_dataset_is_read() -> None:
    base = {"id": "c", "prompt": "?", "expected": "1", "checker": {"kind": "number"}}
    with pytest.raises(ValueError, match="add up to more than 1"):
        Task.model_validate(
            {**base, "credit": {"well_formed": 0.6, "tool": 0.6, "call": {"name": "x"}}}
        )
    with pytest.raises(ValueError, match="needs `call`"):
        Task.model_validate({**base, "credit": {"tool": 0.5}})
    python = {"id": "p", "prompt": "?", "checker": {"kind": "python", "function": "a.b:c"}}
    with pytest.raises(ValueError, match="no `credit`"):
        Task.model_validate({**python, "credit": {"well_formed": 0.5}})


def test_file_checker_reads_the_scratch_directory(tmp_path: Path) -> None:
    task = Task(id="f", prompt="?", checker={"kind": "file", "path": "out/a.txt", "equals": "ok"})
    assert score(task, "", tmp_path) == FAIL
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.txt").write_text("ok\n")
    assert score(task, "", tmp_path) == PASS


def run(sandbox: Sandbox, command: str):
    return asyncio.run(sandbox.run(command))


def test_sandbox_runs_commands_in_its_scratch_directory(tmp_path: Path) -> None:
    box = Sandbox(tmp_path / "scratch")
    box.write_files({"names.txt": "carol\nalice\n"})
    assert run(box, "sort names.txt > sorted.txt").exit_code == 0
    assert (tmp_path / "scratch" / "sorted.txt").read_text() == "alice\ncarol\n"
    assert run(box, "echo more >> sorted.txt").exit_code == 0
    assert run(box, "wc -l sorted.txt").output.split()[0] == "3"
    assert run(box, "cat *.txt").output.count("alice") == 2  # globs expand inside
    assert run(box, "pwd").output.strip() == str((tmp_path / "scratch").resolve())


@pytest.mark.parametrize(
    "command",
    [
        "touch ../outside.txt",
        "echo pwned > ../outside.txt",
        "cp names.txt /tmp/../{out}/outside.txt",
        "mkdir {out}/outside.txt",
        "sort names.txt --output={out}/outside.txt",
        "sort names.txt -o{out}/outside.txt",
        "cp names.txt link/outside.txt",  # a symlink inside that points out
        "sh -c 'echo pwned > ../outside.txt'",
        'python3 -c \'open("../outside.txt", "w")\'',
        "echo pwned | tee ../outside.txt",
        "echo $(touch ../outside.txt)",
        "touch a; touch ../outside.txt",
    ],
)
def test_sandbox_cannot_write_outside_its_scratch_directory(tmp_path: Path, command: str) -> None:
    box = Sandbox(tmp_path / "scratch")
    box.write_files({"names.txt": "bob\n"})
    (tmp_path / "scratch" / "link").symlink_to(tmp_path)
    result = run(box, command.format(out=tmp_path))
    assert result.refused is not None, result
    assert not (tmp_path / "outside.txt").exists()
    assert "refused" in result.for_model()


def test_sandbox_kills_a_command_past_its_time_limit(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, time_limit_s=0.5)
    started = time.monotonic()
    result = run(box, "sleep 30")
    assert time.monotonic() - started < 5
    assert result.timed_out and result.exit_code is None
    assert "time limit" in result.for_model()


def test_sandbox_cuts_and_kills_past_its_output_limit(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, time_limit_s=10, output_limit=1000)
    started = time.monotonic()
    result = run(box, "seq 1 100000000")
    assert time.monotonic() - started < 5
    assert result.truncated and len(result.output) <= 1000
    assert "output limit" in result.for_model()


def test_sandbox_caps_the_size_of_files_it_writes(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, time_limit_s=10, file_limit=10_000)
    result = run(box, "seq 1 1000000 > big.txt")
    assert result.exit_code != 0
    assert (tmp_path / "big.txt").stat().st_size <= 10_000
