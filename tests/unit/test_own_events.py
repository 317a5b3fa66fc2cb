"""The worker's memory of the turns and judgements it sent: taken back only for the exact bytes
it encoded, once; anything else is decoded and validated as before."""

from __future__ import annotations

from claw_stream.events import Judgement, SourceScore, Turn, decode_event, encode_event
from claw_stream.worker.stages.own_events import OwnEvents

from ..support.factories import make_judgement, make_turn


def test_an_event_read_back_as_sent_is_the_event_sent_once() -> None:
    judgement = make_judgement()
    raw = encode_event(judgement)
    own = OwnEvents(max_bytes=1 << 20)
    own.sent(raw, judgement, judgement.session_id)
    assert own.take(Judgement, bytes(bytearray(raw))) is judgement  # equal bytes, new object
    assert own.take(Judgement, raw) is None  # a duplicate delivery is decoded
    assert (own.hits, own.misses, own.bytes, len(own)) == (1, 1, 0, 0)


def test_other_bytes_or_another_type_are_not_taken() -> None:
    judgement = make_judgement()
    raw = encode_event(judgement)
    own = OwnEvents(max_bytes=1 << 20)
    own.sent(raw, judgement, judgement.session_id)
    # another worker's encoding of an equal event, or a record edited on the way: decoded
    assert own.take(Judgement, raw.replace(b'"prm_score":1', b'"prm_score":0')) is None
    assert own.take(Judgement, raw + b" ") is None
    assert own.take(Turn, raw) is None  # the same bytes read as another model: not this event
    assert own.take(Judgement, raw) is judgement  # still held for its own reader


def test_the_budget_drops_the_oldest_and_a_forgotten_session_leaves_memory() -> None:
    a, b = make_turn(), make_judgement()
    raw_a, raw_b = encode_event(a), encode_event(b)
    own = OwnEvents(max_bytes=len(raw_a) + len(raw_b) - 1)
    own.sent(raw_a, a, a.session_id)
    own.sent(raw_b, b, b.session_id)  # over budget: a (the oldest) goes
    assert len(own) == 1 and own.bytes == len(raw_b)
    assert own.take(Turn, raw_a) is None
    own.sent(raw_b + raw_b, b, "other")  # larger than the whole budget: not held
    assert own.bytes == len(raw_b)
    own.drop_sessions([b.session_id])
    assert own.bytes == 0 and own.take(Judgement, raw_b) is None
    own.sent(raw_b, b, b.session_id)
    own.discard([raw_b, raw_a])  # a send that failed: not held (and a raw never held: nothing)
    assert own.bytes == 0 and len(own) == 0


def test_what_the_judge_sends_decodes_to_an_equal_event() -> None:
    """The premise of taking an event back undecoded: encoding a judgement as the judge builds
    it (its reward sources added by model_copy) loses nothing that decoding would restore."""
    judgement = make_judgement()
    rewards = [*judgement.rewards, SourceScore(source="length", score=-0.25, explanation="long")]
    sent = judgement.model_copy(update={"rewards": rewards, "history_cut": 2})
    assert decode_event(Judgement, encode_event(sent)) == sent
    turn = make_turn()
    assert decode_event(Turn, encode_event(turn)) == turn
