"""On-policy distillation through the real worker: hint votes, teacher log-probs of the same
response tokens, `opd` samples the trainer can take."""

from __future__ import annotations

import pytest

from claw_stream.events import Sample, SessionEvent

from ..support.worker import (
    JudgeStub,
    chat,
    events_on,
    new_id,
    private_worker,
    send,
    wait_for,
)


@pytest.fixture(scope="module")
def judge():
    stub = JudgeStub()
    yield stub
    stub.stop()


async def test_opd_samples_carry_teacher_logprobs_of_the_sampled_tokens(
    broker, postgres, tmp_path_factory, judge: JudgeStub
) -> None:
    worker, topics, _ = await private_worker(
        broker,
        postgres,
        tmp_path_factory.mktemp("opd-worker"),
        "opd",
        judge_url=judge.url,
        method="opd",
        prm_votes=0,
        hint_votes=2,
    )
    try:
        hinted, plain = new_id("hinted"), new_id("plain")
        hinted_steps = chat(hinted, ["Explain DNS.", "wrong, that is far too long"])
        await send(broker, topics.steps, hinted_steps + chat(plain, ["Hi.", "ok"]))
        await send(
            broker,
            topics.session_events,
            [SessionEvent(session_id=s, kind="ended", n_steps=2) for s in (hinted, plain)],
        )

        async def samples() -> list[Sample] | None:
            worker.check()
            found = await events_on(broker, topics.samples, Sample)
            return found if {s.session_id for s in found} >= {hinted, plain} else None

        found = await wait_for(samples, "opd samples of both sessions", 90)
        (taught,) = [s for s in found if s.session_id == hinted]
        assert taught.method == "opd" and taught.step_id == hinted_steps[0].step_id
        assert taught.response_token_ids == hinted_steps[0].response_token_ids
        assert taught.teacher_logprobs == [-0.25] * len(taught.response_token_ids)
        # no accepted hint anywhere in `plain`: its one sample teaches nothing by distillation
        (kept,) = [s for s in found if s.session_id == plain]
        assert kept.teacher_logprobs == kept.response_logprobs
        assert judge.calls.get("tokenize", 0) >= 1 and judge.calls.get("completions", 0) >= 1
    finally:
        worker.stop()
