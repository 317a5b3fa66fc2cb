"""claw_stream.api: the built-in plugins are what the interfaces say, and a user's object that
cannot be called as its extension point calls it is refused at load, naming the setting."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from claw_stream.api import (
    LossConfig,
    LossFunction,
    Metadata,
    RedactionRule,
    ReplayRule,
    RewardSource,
    Scorer,
    TaskChecker,
    Turn,
)
from claw_stream.api.loss import LOSS_ARGUMENTS
from claw_stream.api.reward_source import SCORER_ARGUMENTS
from claw_stream.cli import main
from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.replay.service import configured_rule
from claw_stream.gateway.redaction import RedactionError, Redactor
from claw_stream.plugins import PluginError, misfit
from claw_stream.tasks.checkers import score
from claw_stream.tasks.dataset import Task
from claw_stream.tasks.tools import ToolError
from claw_stream.trainer.losses import load_loss, policy_loss
from claw_stream.worker import reaction
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.reward_sources import RuleSource, load_sources

HERE = __name__


# --- what users write, of the wrong shape ---------------------------------------------------------


def one_argument(turn: Turn) -> float:
    return 1.0


def no_ref(config: LossConfig, new: Any, old: Any, behaviour: Any, advantage: Any, mask: Any):
    return new.sum()


def two_texts(text: str, other: str) -> str:
    return text


def no_scratch(answer: str, task: Task) -> float:
    return 1.0


def keyword_only(request: dict[str, Any], *, answer: str) -> float:
    return 0.0


# --- the built-in ones fit (mypy checks the assignments too) --------------------------------------


def test_the_built_in_plugins_are_what_the_interfaces_say() -> None:
    reaction_scorer: Scorer = reaction.score
    ppo: LossFunction = policy_loss
    config = WorkerSettings(
        rewards=[
            {"use": "reaction"},
            {"name": "ci", "use": "external", "url": "http://127.0.0.1:9/score"},
            {"name": "thumbs", "use": "rm", "url": "http://127.0.0.1:9"},
        ]
    )
    sources: list[RewardSource] = load_sources(config)
    rule: RewardSource = RuleSource(config.rewards[0], reaction_scorer)
    assert [s.name for s in sources] == ["reaction", "ci", "thumbs"]
    assert rule.timeout_s == config.rewards[0].timeout_s
    assert misfit(reaction_scorer, SCORER_ARGUMENTS) is None
    assert misfit(ppo, LOSS_ARGUMENTS) is None
    assert load_loss(None) is policy_loss


def test_what_a_plugin_may_look_like_beyond_a_plain_function() -> None:
    async def later(turn: Turn, metadata: Metadata) -> float:
        return 0.0

    class Scoring:
        def __call__(self, turn: Turn, metadata: Metadata, extra: int = 0) -> float:
            return 0.0

    def anything(*args: Any) -> float:
        return 0.0

    scorers: list[Scorer] = [later, Scoring(), anything, functools.partial(anything, 1)]
    for scorer in scorers:
        assert misfit(scorer, SCORER_ARGUMENTS) is None, scorer
    assert misfit(len, ("text",)) is None  # a builtin's signature may not be readable: called as is
    checker: TaskChecker = lambda answer, task, scratch: 1.0  # noqa: E731
    redact: RedactionRule = str.upper
    replay: ReplayRule = lambda request, answer: 0.0  # noqa: E731
    assert (checker("a", None, None), redact("a"), replay({}, "a")) == (1.0, "A", 0.0)  # type: ignore[arg-type]


# --- the wrong shape is refused at load, naming the setting ---------------------------------------


def test_a_scorer_of_the_wrong_shape_is_refused_naming_the_source() -> None:
    config = WorkerSettings(rewards=[{"name": "x", "use": f"{HERE}:one_argument"}])
    with pytest.raises(PluginError) as caught:
        load_sources(config)
    assert str(caught.value).startswith(f"worker.rewards[x] ({HERE}:one_argument): ")
    assert "cannot be called as one_argument(turn, metadata): too many positional" in str(
        caught.value
    )


def test_a_loss_of_the_wrong_shape_is_refused_naming_the_setting() -> None:
    with pytest.raises(PluginError, match=re.escape(f"trainer.loss ({HERE}:no_ref): ")) as caught:
        load_loss(f"{HERE}:no_ref")
    assert "no_ref(config, new, old, behaviour, advantage, mask, ref)" in str(caught.value)


def test_a_redactor_of_the_wrong_shape_is_refused_naming_it() -> None:
    with pytest.raises(
        RedactionError,
        match=re.escape(f"redactor '{HERE}:two_texts': cannot be called as two_texts(text): "),
    ):
        Redactor({}, [f"{HERE}:two_texts"])


def test_a_task_checker_of_the_wrong_shape_fails_its_episode_naming_the_task() -> None:
    task = Task.model_validate(
        {
            "id": "t-1",
            "prompt": "?",
            "checker": {"kind": "python", "function": f"{HERE}:no_scratch"},
        }
    )
    with pytest.raises(
        ToolError, match=re.escape(f"task t-1: checker {HERE}:no_scratch ")
    ) as caught:
        score(task, "an answer")
    assert "no_scratch(answer, task, scratch)" in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the runner records it as the episode's error


def test_a_replay_rule_of_the_wrong_shape_is_refused_naming_the_setting() -> None:
    with pytest.raises(PluginError, match=re.escape("eval.replay_rule: ")):
        configured_rule(EvalSettings(replay_rule=f"{HERE}:keyword_only"))


def test_the_worker_and_the_trainer_refuse_to_start_with_the_wrong_shape(tmp_path: Path) -> None:
    bad = [{"name": "x", "use": f"{HERE}:one_argument"}]
    worker = CliRunner().invoke(main, ["worker"], env={"CLAW_WORKER__REWARDS": json.dumps(bad)})
    assert worker.exit_code == 1, worker.output
    assert "one_argument(turn, metadata)" in worker.output and "Traceback" not in worker.output
    trainer = CliRunner().invoke(
        main, ["trainer", "--model", str(tmp_path)], env={"CLAW_TRAINER__LOSS": f"{HERE}:no_ref"}
    )
    assert trainer.exit_code == 1, trainer.output
    assert f"trainer.loss ({HERE}:no_ref)" in trainer.output
