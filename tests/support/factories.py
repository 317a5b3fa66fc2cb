"""One valid instance of every event kind, built the way producers build them."""

from __future__ import annotations

from claw_stream.events import (
    ChatMessage,
    DeadLetter,
    Event,
    FunctionCall,
    HintVote,
    Judgement,
    Sample,
    SamplingParams,
    SessionEvent,
    Step,
    StepRequest,
    StepResponse,
    ToolCall,
    Turn,
    Usage,
    WeightEvent,
)
from claw_stream.ids import derive_uuid7, uuid7


def make_step(session_id: str = "sess-1", turn_index: int = 0) -> Step:
    return Step(
        session_id=session_id,
        group_id="g1",
        turn_index=turn_index,
        request=StepRequest(
            model="policy",
            messages=[
                ChatMessage(role="developer", content="You are terse."),
                ChatMessage(role="user", content="List the files."),
            ],
            tools=[
                {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
            ],
            sampling=SamplingParams(temperature=0.7, max_tokens=64),
            stream=True,
        ),
        response=StepResponse(
            message=ChatMessage(
                role="assistant",
                content=None,
                tool_calls=[
                    ToolCall(id="call_1", function=FunctionCall(name="ls", arguments="{}"))
                ],
            ),
            finish_reason="tool_calls",
        ),
        prompt_token_ids=[1, 2, 3, 4],
        response_token_ids=[10, 11, 12],
        response_logprobs=[-0.1, -2.5, -0.01],
        weight_version=3,
        engine="http://127.0.0.1:8001",
        latency_ms=41.5,
        usage=Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7),
    )


def make_turn(step: Step | None = None) -> Turn:
    step = step or make_step()
    nxt = make_step(step.session_id, step.turn_index + 1)
    return Turn(
        turn_id=derive_uuid7(step.step_id, "turn"),
        session_id=step.session_id,
        step=step,
        next_state=[ChatMessage(role="tool", tool_call_id="call_1", content="a.txt b.txt")],
        next_step_id=nxt.step_id,
        closed_reason="next_step",
    )


def make_judgement(turn: Turn | None = None) -> Judgement:
    turn = turn or make_turn()
    return Judgement(
        judgement_id=derive_uuid7(turn.turn_id, "judgement"),
        session_id=turn.session_id,
        turn=turn,
        judge_model="policy",
        prm_votes=[1, 1, 0],
        prm_raw=["\\boxed{1}", "\\boxed{1}", "\\boxed{0}"],
        prm_score=1,
        hint_votes=[HintVote(score=1, hint="Use ls -la to show hidden files.", raw="...")],
        hint="Use ls -la to show hidden files.",
        teacher_logprobs=[-0.2, -1.0, -0.05],
    )


def make_sample(judgement: Judgement | None = None) -> Sample:
    judgement = judgement or make_judgement()
    step = judgement.turn.step
    return Sample(
        sample_id=derive_uuid7(judgement.judgement_id, "sample:combine"),
        session_id=step.session_id,
        group_id=step.group_id,
        step_id=step.step_id,
        turn_id=judgement.turn.turn_id,
        method="combine",
        prompt_token_ids=step.prompt_token_ids,
        response_token_ids=step.response_token_ids,
        response_logprobs=step.response_logprobs,
        teacher_logprobs=judgement.teacher_logprobs,
        reward=1.0,
        reward_source="prm",
        weight_version=step.weight_version,
        released_at_version=4,
    )


def one_of_each() -> dict[str, Event]:
    step = make_step()
    judgement = make_judgement(make_turn(step))
    return {
        "claw.steps": step,
        "claw.session-events": SessionEvent(
            session_id="sess-1", kind="feedback", score=-1, text="too long"
        ),
        "claw.turns": judgement.turn,
        "claw.judgements": judgement,
        "claw.samples": make_sample(judgement),
        "claw.weights": WeightEvent(
            policy="policy", version=4, status="ready", checkpoint_path="/ckpt/v4"
        ),
        "claw.dlq": DeadLetter(
            source_topic="claw.steps",
            partition=0,
            offset=17,
            key="sess-1",
            value="{not json",
            error_type="EventError",
            error="invalid Step: <root>: Invalid JSON",
            processor="stitch",
        ),
    }


def sample_of(step: Step, reward: float, reward_source: str = "prm") -> Sample:
    """The binary sample the worker makes of a step's turn with this reward."""
    return Sample(
        sample_id=uuid7(),
        session_id=step.session_id,
        group_id=step.group_id,
        step_id=step.step_id,
        turn_id=uuid7(),
        method="binary",
        prompt_token_ids=step.prompt_token_ids,
        response_token_ids=step.response_token_ids,
        response_logprobs=step.response_logprobs,
        reward=reward,
        reward_source=reward_source,  # type: ignore[arg-type]
        weight_version=step.weight_version,
        released_at_version=step.weight_version,
    )


def answered(step: Step, content: str, prompt: str | None = None) -> Step:
    """Another call like `step` (a new id) whose answer is `content`; a new user prompt if given."""
    messages = step.request.messages
    if prompt is not None:
        messages = [*messages[:-1], ChatMessage(role="user", content=prompt)]
    return step.model_copy(
        update={
            "step_id": uuid7(),
            "request": step.request.model_copy(update={"messages": messages}),
            "response": step.response.model_copy(
                update={"message": ChatMessage(role="assistant", content=content)}
            ),
        }
    )
