"""The judge client against an OpenAI/vLLM-protocol server whose answers the test controls."""

from __future__ import annotations

import json

import pytest

from claw_stream.events import ChatMessage
from claw_stream.skills.text import with_block
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.judge_client import JudgeClient
from claw_stream.worker.logic.judge_prompts import HINT_STOPS, VOTE_STOPS, teacher_messages
from claw_stream.worker.logic.samples import assemble_session
from claw_stream.worker.logic.turns import stitch_session

from ..support.worker import JudgeStub, chat


@pytest.fixture(scope="module")
def stub():
    server = JudgeStub(slow_s=5)
    yield server
    server.stop()


def turns_of(replies: list[str]):
    return stitch_session(chat("s-judge", replies), closed="session_ended")


async def test_opd_hint_votes_and_teacher_logprobs_of_the_same_tokens(stub: JudgeStub) -> None:
    config = WorkerSettings(judge_url=stub.url, method="opd", prm_votes=3, hint_votes=2)
    client = JudgeClient(config)
    try:
        first, last = turns_of(["Explain DNS.", "That is wrong, too long."])
        outcome = await client.judge(first)
        j = outcome.judgement
        assert outcome.errors == []
        assert j.prm_votes == [-1, -1, -1] and j.prm_score == -1 and len(j.prm_raw) == 3
        assert [v.score for v in j.hint_votes] == [1, 1]
        assert j.hint == "Answer in one short sentence."
        # one teacher logprob per response token: the stub scores every token -0.25
        assert j.teacher_logprobs == [-0.25] * len(first.step.response_token_ids)
        # the last turn has no next state: nothing to judge, no teacher
        closing = (await client.judge(last)).judgement
        assert closing.prm_votes == [] and closing.prm_score is None
        assert closing.teacher_logprobs is None
        drafts = assemble_session([j, closing], [], config, "claw.samples")
        assert [d.has_signal for d in drafts] == [True, False]
        assert drafts[0].sample.teacher_logprobs == j.teacher_logprobs
        # without a hint the teacher equals the behaviour policy: no distillation signal
        assert drafts[1].sample.teacher_logprobs == last.step.response_logprobs
    finally:
        await client.aclose()


@pytest.mark.parametrize("max_n", [16, 2, 1], ids=["takes-n", "caps-n", "ignores-n"])
async def test_the_votes_are_asked_for_at_once_and_topped_up(max_n: int) -> None:
    """Three votes in one request with n=3 where the server takes n (OpenAI, vLLM, our
    engine); where it returns fewer choices (llama.cpp ignores n), more requests for the rest."""
    server = JudgeStub(max_n=max_n)
    client = JudgeClient(WorkerSettings(judge_url=server.url, prm_votes=3))
    try:
        first, _ = turns_of(["Hi.", "thanks"])
        outcome = await client.judge(first)
        assert outcome.errors == []
        assert outcome.judgement.prm_votes == [1, 1, 1] and outcome.judgement.prm_score == 1
        assert server.votes == 3
        assert server.calls["prm"] == {16: 1, 2: 2, 1: 3}[max_n]
        assert [b.get("n", 1) for b in server.bodies] == {16: [3], 2: [3, 1], 1: [3, 2, 1]}[max_n]
    finally:
        await client.aclose()
        server.stop()


@pytest.mark.parametrize(("busy", "retries"), [(2, 2), (5, 1)], ids=["recovers", "gives-up"])
async def test_an_overloaded_judge_is_asked_again_up_to_judge_retries(
    busy: int, retries: int
) -> None:
    """503s are retried with backoff (judge_retries more attempts); past them, one error
    per vote and no score."""
    server = JudgeStub(busy=busy)
    client = JudgeClient(WorkerSettings(judge_url=server.url, judge_retries=retries))
    try:
        first, _ = turns_of(["Hi.", "thanks"])
        outcome = await client.judge(first)
        assert len(server.bodies) == min(busy + 1, retries + 1)
        if busy <= retries:
            assert outcome.errors == [] and outcome.judgement.prm_votes == [1, 1, 1]
        else:
            assert len(outcome.errors) == 3 and all("503" in e for e in outcome.errors)
            assert outcome.judgement.prm_score is None
    finally:
        await client.aclose()
        server.stop()


async def test_failed_votes_are_reported_not_raised(stub: JudgeStub) -> None:
    config = WorkerSettings(judge_url=stub.url, judge_timeout_s=0.5, judge_retries=1)
    client = JudgeClient(config)
    try:
        first, _ = turns_of(["Hi.", "SLOW answer please"])
        outcome = await client.judge(first)
        assert len(outcome.errors) == 3 and all("Timeout" in e for e in outcome.errors)
        assert outcome.judgement.prm_score is None
    finally:
        await client.aclose()


async def test_an_unreachable_judge_is_an_error_per_vote() -> None:
    config = WorkerSettings(judge_url="http://127.0.0.1:9/v1", judge_model="m", judge_retries=0)
    client = JudgeClient(config)
    try:
        first, _ = turns_of(["Hi.", "thanks"])
        outcome = await client.judge(first)
        assert len(outcome.errors) == 3 and outcome.judgement.prm_votes == []
    finally:
        await client.aclose()


BLOCK = "<claw-skills>\n- Answer in under 30 words.\n</claw-skills>"


def _carrying(turn, server: JudgeStub, renders_alike: bool = True):
    """The turn as served with a skills block: the prompt ids the engine saw, rendered alike
    by this judge (the policy's model) or not (another model)."""
    step = turn.step
    note = {"ids": ["s-1"], "block": BLOCK, "position": "first_user"}
    sent = [m.model_dump(exclude_none=True) for m in step.request.messages]
    seen = server.tokens_of(with_block(sent, BLOCK)) if renders_alike else [7, 7, 7]
    request = step.request.model_copy(update={"extra": {"claw_skills": note}})
    served = step.model_copy(update={"request": request, "prompt_token_ids": seen})
    return turn.model_copy(update={"step": served}), sent


@pytest.mark.parametrize("next_state", ["That is wrong, too long.", "thanks"])
async def test_a_call_that_carried_skills_is_sampled_with_its_prompt_without_them(
    next_state: str,
) -> None:
    """Skills now, weights later: the judgement keeps the prompt without the call's skills, as
    the judge renders the Step's own messages, once it checked the judge renders the served
    prompt as the engine did; the teacher reads the skills and the hint. With a hint or
    without, the sample (prompt without skills, answer sampled with them) has a signal."""
    server = JudgeStub()
    config = WorkerSettings(judge_url=server.url, method="opd", prm_votes=1, hint_votes=1)
    client = JudgeClient(config)
    try:
        first, _ = turns_of(["Explain DNS.", next_state])
        turn, sent = _carrying(first, server)
        j = (await client.judge(turn)).judgement
        assert j.prompt_without_skills == server.tokens_of(sent)
        (draft,) = assemble_session([j], [], config, "claw.samples")
        assert draft.has_signal and draft.sample.without_skills
        assert draft.sample.prompt_token_ids == server.tokens_of(sent)
        if j.hint:  # the teacher read the skills block, then the hint
            teacher = next(b for b in server.tokenized if "[Hint]" in json.dumps(b))
            asked = [m["content"] for m in teacher["messages"] if m["role"] == "user"]
            assert asked == [f"Explain DNS.\n\n{BLOCK}\n\n[Hint] {j.hint}"]
        else:  # the teacher is the policy that answered with the skills
            assert draft.sample.teacher_logprobs == turn.step.response_logprobs
        # switched off, the sample keeps the prompt the engine saw
        off = WorkerSettings(**{**config.model_dump(), "distil_skills": False})
        (kept,) = assemble_session([j], [], off, "claw.samples")
        assert kept.sample.prompt_token_ids == turn.step.prompt_token_ids
        assert not kept.sample.without_skills
    finally:
        await client.aclose()
        server.stop()


async def test_skills_stay_in_the_prompt_where_the_judge_is_another_model_or_away(caplog) -> None:
    """A judge that renders the served prompt otherwise (another model) or cannot be reached:
    the sample is trained with the skills it carried, the turn is judged as ever, once."""
    server = JudgeStub()
    client = JudgeClient(WorkerSettings(judge_url=server.url, prm_votes=1))
    away = JudgeClient(
        WorkerSettings(judge_url="http://127.0.0.1:9/v1", judge_model="m", prm_votes=0)
    )
    try:
        first, _ = turns_of(["Explain DNS.", "thanks"])
        turn, _ = _carrying(first, server, renders_alike=False)
        for judge in (client, away):
            outcome = await judge.judge(turn)
            assert outcome.errors == [] and outcome.judgement.prompt_without_skills is None
        assert "another model" in caplog.text and "could not render" in caplog.text
        assert server.calls["tokenize"] == 1  # the served prompt, found unlike: no second
    finally:
        await client.aclose()
        await away.aclose()
        server.stop()


def test_the_teacher_sees_the_hint_in_the_last_user_message() -> None:
    first, _ = turns_of(["Explain DNS.", "wrong"])
    messages = teacher_messages(first, "Be brief.")
    assert messages[-1] == ChatMessage(role="user", content="Explain DNS.\n\n[Hint] Be brief.")


PLAIN, ROOM = 128, 4096  # judge_plain_max_tokens, judge_max_tokens: the defaults


@pytest.mark.parametrize(
    ("judge", "stops", "rooms"),
    [
        ({}, [VOTE_STOPS, HINT_STOPS] * 2, [PLAIN] * 4),
        ({"thinks": True}, [VOTE_STOPS] + [None] * 4, [PLAIN] + [ROOM] * 4),
        (
            {"reasons_apart": True},
            [VOTE_STOPS, VOTE_STOPS, HINT_STOPS, VOTE_STOPS, HINT_STOPS],
            [PLAIN] + [ROOM] * 4,
        ),
        ({"names_stop": False}, [VOTE_STOPS] + [None] * 4, [PLAIN] * 5),
    ],
    ids=["engine-or-vllm", "thinking-judge", "reasoning-parser", "hosted-api"],
)
async def test_a_vote_ends_at_its_verdict_and_a_thinking_judge_keeps_its_room(
    judge: dict[str, bool], stops: list[tuple[str, ...] | None], rooms: list[int]
) -> None:
    """A vote stops at its box and a hint at its end, where the judge would go on talking. A
    judge that shows no thinking gets judge_plain_max_tokens (a small model that never writes
    its box costs that, not 4,096); one whose answer shows thinking, in `<think>` or in the
    server's reasoning field, gets judge_max_tokens from then on, and the vote it cut short is
    asked again. A judge that meets a stop inside its thinking, or a server that does not name
    the stop it met, is asked again without stops, and from then on: the same verdicts in
    every case."""
    server = JudgeStub(**judge)
    config = WorkerSettings(judge_url=server.url, method="opd", prm_votes=2, hint_votes=1)
    client = JudgeClient(config)
    try:
        first, _ = turns_of(["Explain DNS.", "That is wrong, too long."])
        for _ in range(2):  # a second turn: what the client learnt of this judge holds
            outcome = await client.judge(first)
            j = outcome.judgement
            assert outcome.errors == []
            assert j.prm_votes == [-1, -1] and j.hint == "Answer in one short sentence."
        sent = [(body.get("stop"), body["max_tokens"]) for body in server.bodies]
        assert sent == [(list(s) if s else None, r) for s, r in zip(stops, rooms, strict=True)]
        if None in stops:
            assert all(raw.endswith("anything else I can judge?") for raw in j.prm_raw)
        else:
            assert j.prm_raw == ["A correction. \\boxed{-1}"] * 2
            hint = "\\boxed{1} [HINT_START]Answer in one short sentence.[HINT_END]"
            assert [v.raw for v in j.hint_votes] == [hint]
    finally:
        await client.aclose()
        server.stop()


@pytest.mark.parametrize("thinks", [True, False])
async def test_the_settings_can_say_whether_the_judge_thinks(thinks: bool) -> None:
    """judge_thinks: true gives every vote judge_max_tokens from the first (a model whose
    template opens its thinking in the prompt shows no `<think>`); false keeps the plain room
    even when an answer shows thinking."""
    server = JudgeStub(reasons_apart=True)
    config = WorkerSettings(judge_url=server.url, prm_votes=2, judge_thinks=thinks)
    client = JudgeClient(config)
    try:
        first, _ = turns_of(["Explain DNS.", "That is wrong, too long."])
        j = (await client.judge(first)).judgement
        assert [body["max_tokens"] for body in server.bodies] == [ROOM if thinks else PLAIN]
        # cut in its thinking, a vote has no verdict: it counts 0
        assert j.prm_votes == ([-1, -1] if thinks else [0, 0])
    finally:
        await client.aclose()
        server.stop()


async def test_the_teacher_reads_its_prompt_with_the_template_variables_served_with() -> None:
    """A thinking model's step served with `enable_thinking: false` (a door translating the
    client's thinking switch): the teacher's prompt is rendered with the same variables, or
    it scores the answer after another prompt than the one the policy answered."""
    server = JudgeStub()
    client = JudgeClient(
        WorkerSettings(judge_url=server.url, method="opd", prm_votes=0, hint_votes=1)
    )
    try:
        first, _ = turns_of(["Explain DNS.", "That is wrong, too long."])
        variables = {"enable_thinking": False}
        request = first.step.request.model_copy(
            update={"extra": {"chat_template_kwargs": variables}}
        )
        served = first.model_copy(
            update={"step": first.step.model_copy(update={"request": request})}
        )
        judged = (await client.judge(served)).judgement
        assert judged.hint and judged.teacher_logprobs
        assert [body.get("chat_template_kwargs") for body in server.tokenized] == [variables]
        await client.judge(first)  # served without: none sent
        assert "chat_template_kwargs" not in server.tokenized[-1]
    finally:
        await client.aclose()
        server.stop()
