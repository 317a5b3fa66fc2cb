"""Each worked example of docs/extending/ works as its page says: the plugin file and the
setting are read from the page, and the plugin runs through the loader and the call the service
uses, on the page's own input."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from claw_stream.evaluation.replay.service import configured_rule
from claw_stream.events import SourceScore
from claw_stream.gateway.redaction import Redactor
from claw_stream.settings import Settings
from claw_stream.tasks.checkers import score
from claw_stream.tasks.dataset import load_tasks
from claw_stream.trainer.losses import as_loss_output, load_loss
from claw_stream.worker.reward_sources import load_sources, score_all

from ..support.factories import answered, make_step, make_turn
from ..support.paths import REPO

PAGES = REPO / "docs" / "extending"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: str, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall((PAGES / page).read_text()) if lang == language]


def example_file(page: str, name: str) -> str:
    """The python block of `page` whose first line is `# name`."""
    found = [b for b in blocks(page, "python") if b.startswith(f"# {name}\n")]
    assert len(found) == 1, f"{page}: one python block starting '# {name}', found {len(found)}"
    return found[0]


def setting(page: str, section: str, naming: str) -> Any:
    """The settings section `section` of the page's `# claw.yaml` block that names `naming`,
    validated as the service's settings validate it."""
    (text,) = [b for b in blocks(page, "yaml") if b.startswith("# claw.yaml\n") and naming in b]
    model = Settings.model_fields[section].annotation
    return model.model_validate(yaml.safe_load(text)[section])


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], str]]:
    """Writes a page's example file where Python imports it (a folder on PYTHONPATH, as the
    page says); returns its module name. The module is forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    modules: list[str] = []

    def write(page: str, name: str) -> str:
        (tmp_path / name).write_text(example_file(page, name))
        modules.append(name.removesuffix(".py"))
        sys.modules.pop(modules[-1], None)
        return modules[-1]

    yield write
    for module in modules:
        sys.modules.pop(module, None)


def test_every_page_has_its_worked_example() -> None:
    for page, name in [
        ("reward-source.md", "my_rules.py"),
        ("reward-source.md", "my_replay_rule.py"),
        ("loss.md", "my_losses.py"),
        ("redaction.md", "my_redactors.py"),
        ("task-checker.md", "my_checkers.py"),
    ]:
        assert example_file(page, name)


async def test_the_reward_source_example_scores_as_documented(install) -> None:
    install("reward-source.md", "my_rules.py")
    worker = setting("reward-source.md", "worker", "my_rules:exact_answer")
    assert worker.precedence == ["explicit", "feedback", "episode", "answer", "prm"]
    (source,) = load_sources(worker)
    step = make_step()

    def said(text: str):
        return make_turn(answered(step, text, "What is 6 * 7?"))

    assert await score_all([source], said("It is 42."), {"answer": 42}) == [
        SourceScore(source="answer", score=1.0, explanation="42 is right")
    ]
    assert await score_all([source], said("6 * 7 = 41"), {"answer": 42}) == [
        SourceScore(source="answer", score=-1.0, explanation="41, not 42")
    ]
    assert await score_all([source], said("It is 42."), {}) == [SourceScore(source="answer")]


def test_the_replay_rule_example_prefers_the_shorter_answer(install) -> None:
    install("reward-source.md", "my_replay_rule.py")
    rule = configured_rule(setting("reward-source.md", "eval", "my_replay_rule:concise"))
    assert rule is not None
    request = {"messages": [{"role": "user", "content": "Do it."}]}
    assert rule.score(request, "Done.") == -1.0
    assert rule.score(request, "I have now done it.") == -5.0


def test_the_loss_example_trains_as_documented(install) -> None:
    install("loss.md", "my_losses.py")
    trainer = setting("loss.md", "trainer", "my_losses:plain_pg_loss")
    loss_fn = load_loss(trainer.loss)
    new = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    old = new.detach()
    advantage = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # as the trainer calls it: every argument, positionally, ref None without KL
    out = as_loss_output(
        loss_fn(trainer.loss_config(), new, old, old, advantage, mask, None), trainer.loss
    )
    assert float(out.loss.detach()) == pytest.approx(0.5)
    assert out.metrics["mean_advantage"] == pytest.approx(1 / 3)
    out.loss.backward()
    assert new.grad is not None and float(new.grad[1, 1]) == 0.0


def test_the_redaction_example_redacts_as_documented(install) -> None:
    install("redaction.md", "my_redactors.py")
    redaction = setting("redaction.md", "gateway", "my_redactors:redact_cards").redaction
    redactor = Redactor(redaction.patterns, redaction.redactors)  # as the gateway makes it
    found = redactor.text(
        "Card 4111 1111 1111 1111, order 1234 5678 9012 3456, mail jane@example.com"
    )
    assert found.text == ("Card [REDACTED:card], order 1234 5678 9012 3456, mail [REDACTED:email]")
    assert found.hits == ("email", "my_redactors:redact_cards")


def test_the_task_checker_example_scores_as_documented(install, tmp_path: Path) -> None:
    install("task-checker.md", "my_checkers.py")
    (line,) = [b for b in blocks("task-checker.md", "json") if "my_checkers:" in b]
    dataset = tmp_path / "primes.jsonl"
    dataset.write_text(line)
    (task,) = load_tasks(str(dataset))
    assert score(task, "They are [2, 3, 5, 7, 11, 13, 17, 19].") == 1.0
    assert score(task, "[2, 3, 5, 7, 9]") == -0.25
    assert score(task, "I do not know.") == -1.0


def test_the_pages_link_only_to_pages_that_exist() -> None:
    for page in PAGES.glob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{page.name} -> {target}"
