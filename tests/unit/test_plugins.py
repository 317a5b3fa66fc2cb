"""Plugins: reward sources, prompt files and losses named in the settings, loaded at start,
scored within their timeouts and combined with the session's signals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from pydantic import ValidationError

from claw_stream.cli import main
from claw_stream.events import SessionEvent, SourceScore
from claw_stream.plugins import PluginError, load
from claw_stream.trainer.config import LossConfig
from claw_stream.trainer.losses import as_loss_output, load_loss, policy_loss
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.judge_client import JudgeClient
from claw_stream.worker.logic.judge_prompts import majority
from claw_stream.worker.logic.rewards import Signals, step_reward
from claw_stream.worker.logic.samples import assemble_session
from claw_stream.worker.logic.turns import stitch_session
from claw_stream.worker.prompt_files import PromptError, check_prompt, load_prompts
from claw_stream.worker.reward_sources import load_sources, score_all, session_metadata

from ..support.scoring_service import Callback
from ..support.worker import JudgeStub, chat, step

PLUGINS = "tests.support.user_plugins"
MATH = {"name": "answer", "use": "rule", "function": f"{PLUGINS}:exact_answer"}


def answered(text: str, session: str = "s-math"):
    """A one-turn session whose assistant answered `text`, closed."""
    from claw_stream.events import ChatMessage

    s = step(
        session,
        0,
        [ChatMessage(role="user", content="What is 6 * 7?")],
        ChatMessage(role="assistant", content=text),
    )
    (turn,) = stitch_session([s], closed="session_ended")
    return turn


# --- loading ----------------------------------------------------------------------------------


def test_a_plugin_loads_by_import_path() -> None:
    from tests.support.user_plugins import exact_answer

    assert load(f"{PLUGINS}:exact_answer", "claw_stream.rewards", "x") is exact_answer


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_such_entry_point", "neither module:attribute nor an entry point"),
        ("tests.support.no_such_module:f", "importing 'tests.support.no_such_module' failed"),
        ("tests.support.broken_plugin:f", "ImportError: broken_plugin needs a package"),
        (f"{PLUGINS}:no_such_function", "has no 'no_such_function'"),
        (f"{PLUGINS}:_NUMBER", "is not callable"),
    ],
)
def test_a_bad_plugin_fails_at_load_naming_it(spec: str, says: str) -> None:
    with pytest.raises(PluginError, match=re.escape("worker.rewards[x]")) as caught:
        load(spec, "claw_stream.rewards", "worker.rewards[x]")
    assert says in str(caught.value) and spec.split(":")[0] in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "plugin", "says"),
    [
        ("CLAW_WORKER__REWARDS", [{**MATH, "function": "tests.support.broken_plugin:f"}], "broken"),
        ("CLAW_WORKER__REWARDS", [{**MATH, "function": "nowhere"}], "nowhere"),
        ("CLAW_WORKER__HINT_PROMPT_FILE", "/no/such/prompt.txt", "/no/such/prompt.txt"),
    ],
)
def test_the_worker_refuses_to_start_with_a_bad_plugin(setting: str, plugin: Any, says) -> None:
    value = plugin if isinstance(plugin, str) else json.dumps(plugin)
    result = CliRunner().invoke(main, ["worker"], env={setting: value})
    assert result.exit_code == 1, result.output
    assert says in result.output and "Traceback" not in result.output


def test_replay_refuses_to_start_with_a_bad_plugin() -> None:
    """Before it reads anything: no broker is there to read from."""
    bad = [{"name": "answer", "use": "tests.support.broken_plugin:score"}]
    result = CliRunner().invoke(
        main,
        ["replay", "--since", "1h", "--to-topic", "claw.samples.new"],
        env={"CLAW_WORKER__REWARDS": json.dumps(bad), "CLAW_KAFKA_BOOTSTRAP": "127.0.0.1:9"},
    )
    assert result.exit_code == 1, result.output
    assert "worker.rewards[answer] (tests.support.broken_plugin:score)" in result.output


def test_the_trainer_refuses_to_start_with_a_bad_loss(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["trainer", "--model", str(tmp_path)],
        env={"CLAW_TRAINER__LOSS": "tests.support.broken_plugin:loss"},
    )
    assert result.exit_code == 1, result.output
    assert "trainer.loss (tests.support.broken_plugin:loss)" in result.output


# --- settings -----------------------------------------------------------------------------------


def test_sources_join_the_precedence_in_their_order() -> None:
    config = WorkerSettings(rewards=[MATH, {"use": "prm"}])
    assert config.precedence == ["explicit", "feedback", "episode", "answer", "prm"]
    assert [r.source_name for r in config.plugin_sources] == ["answer"]
    assert WorkerSettings().precedence == ["explicit", "feedback", "episode", "reaction", "prm"]


@pytest.mark.parametrize(
    ("worker", "says"),
    [
        ({"rewards": [MATH], "precedence": ["answer", "typo"]}, "typo"),
        ({"rewards": [MATH, MATH]}, "distinct names"),
        ({"rewards": [{"use": "rule"}]}, "rule needs function"),
        ({"rewards": [{"use": "external"}]}, "external needs url"),
        ({"rewards": [{"use": f"{PLUGINS}:exact_answer"}]}, "needs a name"),
        ({"rewards": [{**MATH, "name": "feedback"}]}, "session signals"),
        ({"rewards": [{"use": "prm", "threshold": 0.4}]}, "greater than 0.5"),
    ],
)
def test_bad_reward_settings_are_refused(worker: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        WorkerSettings(**worker)


# --- combining -----------------------------------------------------------------------------------


def test_sources_combine_by_precedence_or_join() -> None:
    signals = Signals(feedback=-1, prm=1, sources={"answer": 1.0, "ci": 0.5})
    assert step_reward(signals, ["answer", "prm"]) == (1.0, "answer")
    assert step_reward(signals, ["feedback", "answer"]) == (-1.0, "feedback")
    assert step_reward(signals, ["ci", "answer", "prm"], "join") == (2.5 / 3, "ci")
    assert step_reward(Signals(sources={}), ["answer"]) == (0.0, "none")


def test_majority_threshold() -> None:
    assert majority([1, 1, -1]) == 1
    assert majority([1, 1, -1], threshold=0.7) == 0  # 2 of 3 is short of 0.7
    assert majority([1, 1, 1, -1], threshold=0.75) == 1
    assert majority([-1, -1, None], threshold=1.0) == -1  # an unparsed vote is no vote


def test_session_metadata_later_keys_win() -> None:
    started = SessionEvent(session_id="s", kind="started", metadata={"answer": 42, "x": 1})
    other = SessionEvent(session_id="s", kind="feedback", score=1, metadata={"answer": 0})
    reward = SessionEvent(session_id="s", kind="reward", reward=1.0, metadata={"answer": 43})
    assert session_metadata([reward, other, started]) == {"answer": 43, "x": 1}


async def test_a_rule_scores_with_the_sessions_ground_truth() -> None:
    (source,) = load_sources(WorkerSettings(rewards=[MATH]))
    right, wrong = answered("It is 42."), answered("6 * 7 = 41")
    assert await score_all([source], right, {"answer": 42}) == [
        SourceScore(source="answer", score=1.0, explanation="42 is right")
    ]
    (scored,) = await score_all([source], wrong, {"answer": 42})
    assert (scored.score, scored.explanation) == (-1.0, "41, not 42")
    # no ground truth: the rule abstains, which is no error
    assert await score_all([source], right, {}) == [SourceScore(source="answer")]


async def test_a_failing_or_slow_source_is_recorded_and_the_rest_still_score() -> None:
    config = WorkerSettings(
        rewards=[
            MATH,
            {"name": "boom", "use": f"{PLUGINS}:raises"},
            {"name": "short", "use": f"{PLUGINS}:short_answer", "timeout_s": 5},
        ]
    )
    sources = load_sources(config)
    answer, boom, short = await score_all(sources, answered("42"), {"answer": "42"})
    assert answer.score == 1.0 and short.score == 1.0  # 3 tokens: short
    assert boom.score is None and boom.error == "ValueError: this rule always fails"


# --- external -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def callback():
    server = Callback()
    yield server
    server.stop()


async def test_an_external_source_gets_the_turn_and_metadata(callback: Callback) -> None:
    config = WorkerSettings(rewards=[{"name": "ci", "use": "external", "url": callback.url}])
    sources, impatient = load_sources(config), []
    try:
        turn = answered("It is 42.")
        (scored,) = await score_all(sources, turn, {"ticket": 7})
        assert scored == SourceScore(source="ci", score=0.25, explanation="9 characters")
        body = callback.bodies[-1]
        assert body["source"] == "ci" and body["metadata"] == {"ticket": 7}
        assert body["turn"]["turn_id"] == str(turn.turn_id)
        impatient = load_sources(
            WorkerSettings(
                rewards=[{"name": "ci", "use": "external", "url": callback.url, "timeout_s": 0.3}]
            )
        )
        (slow,) = await score_all(impatient, answered("SLOW 42"), {})
        assert slow.score is None and slow.error == "no score within 0.3 s"
    finally:
        for s in sources + impatient:
            await s.aclose()


# --- the judge with sources and prompt files ----------------------------------------------------


@pytest.fixture(scope="module")
def stub():
    server = JudgeStub(slow_s=5)
    yield server
    server.stop()


async def test_judgements_record_every_source_and_samples_follow_precedence(
    stub: JudgeStub, callback: Callback
) -> None:
    config = WorkerSettings(
        judge_url=stub.url,
        prm_votes=1,
        rewards=[
            MATH,
            {"name": "ci", "use": "external", "url": callback.url, "timeout_s": 0.5},
            {"use": "prm"},
        ],
    )
    client = JudgeClient(config)
    try:
        steps = chat("s-mix", ["What is 6 * 7?", "thanks"])
        first, last = stitch_session(steps, closed="session_ended")
        outcome = await client.judge(first, metadata={"answer": 0})  # "answer 0 of s-mix"
        assert outcome.errors == []
        j = outcome.judgement
        assert {r.source: r.score for r in j.rewards} == {"answer": 1.0, "ci": 0.25, "prm": 1.0}
        slow = last.model_copy(
            update={"step": last.step.model_copy(update={"response": _said(last, "SLOW 3")})}
        )
        late = await client.judge(slow, metadata={"answer": 0})
        assert late.errors == ["reward source ci: no score within 0.5 s"]
        drafts = assemble_session([j, late.judgement], [], config, "claw.samples")
        assert [(d.sample.reward, d.sample.reward_source) for d in drafts] == [
            (1.0, "answer"),
            (-1.0, "answer"),  # judged without ci; "3" is not 0
        ]
    finally:
        await client.aclose()


def _said(turn, text: str):
    from claw_stream.events import ChatMessage

    message = ChatMessage(role="assistant", content=text)
    return turn.step.response.model_copy(update={"message": message})


async def test_a_prompt_file_is_what_the_judge_reads(stub: JudgeStub, tmp_path: Path) -> None:
    prompt = tmp_path / "prm.txt"
    prompt.write_text("Support ticket review.\n{transcript}\nAnswer \\boxed{1} or \\boxed{-1}.")
    config = WorkerSettings(
        judge_url=stub.url, prm_votes=1, rewards=[{"use": "prm", "prompt_file": str(prompt)}]
    )
    client = JudgeClient(config)
    try:
        first, _ = stitch_session(chat("s-prompt", ["Reset my password.", "thanks"]), closed="done")
        judgement = (await client.judge(first)).judgement
        (sent,) = stub.bodies[-1]["messages"]
        assert sent["role"] == "user" and sent["content"].startswith("Support ticket review.\n")
        assert (
            "[next state: user] thanks" in sent["content"] and "{transcript}" not in sent["content"]
        )
        assert judgement.prm_score == 1
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("text", "needs", "says"),
    [
        ("Judge this. \\boxed{1}", ("\\boxed",), "no {transcript} placeholder"),
        ("{transcript} {task} \\boxed{1}", ("\\boxed",), "unknown placeholder(s) {task}"),
        ("{transcript} say 1 or -1", ("\\boxed",), "must ask for \\boxed"),
        ("{transcript} \\boxed{1}", ("\\boxed", "[HINT_START]", "[HINT_END]"), "[HINT_START] and"),
    ],
)
def test_a_prompt_without_what_its_judge_needs_is_refused(text, needs, says) -> None:
    with pytest.raises(PromptError, match=re.escape("hint.txt")) as caught:
        check_prompt(text, "hint.txt", needs)
    assert says in str(caught.value)


def test_prompt_files_are_read_and_checked_at_start(tmp_path: Path) -> None:
    hint = tmp_path / "hint.txt"
    hint.write_text("{transcript}\n\\boxed{1} [HINT_START]...[HINT_END] or \\boxed{-1}")
    assert load_prompts(WorkerSettings(hint_prompt_file=hint)).hint == hint.read_text()
    hint.write_bytes(b"\xff\xfe{transcript}")
    with pytest.raises(PromptError, match="not UTF-8"):
        load_prompts(WorkerSettings(hint_prompt_file=hint))


# --- losses ---------------------------------------------------------------------------------------


def test_a_user_loss_returns_a_loss_and_metrics() -> None:
    loss = load_loss(f"{PLUGINS}:plain_pg_loss")
    assert load_loss(None) is policy_loss
    new = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    old = new.detach()
    advantage = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    out = as_loss_output(loss(LossConfig(), new, old, old, advantage, mask), "plain")
    # sample 1: -(-1 - 2) / 2 = 1.5; sample 2: -(-0.5 * -1) / 1 = -0.5; mean 0.5
    assert float(out.loss.detach()) == pytest.approx(0.5)
    assert out.metrics["mean_advantage"] == pytest.approx(1 / 3)
    out.loss.backward()
    assert new.grad is not None and float(new.grad[1, 1]) == 0.0  # masked


@pytest.mark.parametrize("returned", ["0.5", (torch.zeros(2), {}), (torch.tensor(1.0), ["x"])])
def test_a_loss_that_returns_something_else_is_named(returned: Any) -> None:
    with pytest.raises(PluginError, match=re.escape("trainer.loss (mine)")):
        as_loss_output(returned, "mine")


# --- entry points and `claw-stream plugins` -------------------------------------------------------


@pytest.fixture
def installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution on sys.path that declares a reward scorer and a loss as entry points, as
    `pip install` of a package with them in its pyproject would."""
    info = tmp_path / "team_signals-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: team-signals\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[claw_stream.rewards]\nmath = {PLUGINS}:exact_answer\n\n"
        f"[claw_stream.losses]\nplain-pg = {PLUGINS}:plain_pg_loss\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


async def test_a_source_and_a_loss_load_by_entry_point_name(installed_package: Path) -> None:
    config = WorkerSettings(rewards=[{"name": "answer", "use": "math"}])
    (source,) = load_sources(config)
    assert (await score_all([source], answered("42"), {"answer": 42}))[0].score == 1.0
    from tests.support.user_plugins import plain_pg_loss

    assert load_loss("plain-pg") is plain_pg_loss


def test_plugins_lists_what_is_installed_and_checks_what_is_used(
    installed_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from claw_stream.cli.common import rich_console

    monkeypatch.setattr(rich_console(), "width", 300)  # one line per table row
    config = tmp_path / "claw.yaml"
    worker = {
        "rewards": [
            {"name": "answer", "use": "math"},
            {"name": "bad", "use": "tests.support.broken_plugin:f"},
            {"use": "prm", "threshold": 0.7},
        ]
    }
    config.write_text(json.dumps({"worker": worker, "trainer": {"loss": "plain-pg"}}))
    result = CliRunner().invoke(main, ["plugins", "--config", str(config), "--check"])
    out = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert f"math │ {PLUGINS}:exact_answer │ team-signals" in out
    assert f"plain-pg │ {PLUGINS}:plain_pg_loss │ team-signals" in out
    assert "worker.rewards[answer] (rule) │ math │ ok" in out
    assert "worker.rewards[bad] (rule)" in out and "ImportError: broken_plugin needs" in out
    assert "trainer.loss │ plain-pg │ ok" in out
    assert "precedence: explicit, feedback, episode, answer, bad, prm" in out
    fixed = {"rewards": worker["rewards"][::2]}
    config.write_text(json.dumps({"worker": fixed, "trainer": {"loss": "plain-pg"}}))
    assert CliRunner().invoke(main, ["plugins", "--config", str(config), "--check"]).exit_code == 0
