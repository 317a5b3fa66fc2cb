"""The `rm` reward source against a real served model: a tiny sequence classifier, trained in
the test, served by the built-in engine on vLLM's `/classify` route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.logic.turns import stitch_session
from claw_stream.worker.reward_sources import load_sources, score_all

from ..support.engine import EngineProcess
from ..support.model_cache import built
from ..support.reward_model import make_reward_model
from ..support.worker import chat


@pytest.fixture(scope="module")
def rm_engine(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = built("reward-model", make_reward_model, smollm2)
    engine = EngineProcess(
        folder, tmp_path_factory.mktemp("rm-engine"), "--served-model-name", "rm"
    )
    yield engine
    engine.stop()


def test_classify_speaks_vllms_dialect(rm_engine: EngineProcess) -> None:
    r = httpx.post(rm_engine.base_url + "/classify", json={"model": "rm", "input": ["a", "bb"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "rm" and body["id"].startswith("classify-")
    assert [d["index"] for d in body["data"]] == [0, 1]
    for d in body["data"]:
        assert d["num_classes"] == 2 and d["label"] in ("good", "bad")
        assert sum(d["probs"]) == pytest.approx(1.0, abs=1e-5)
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] == 0
    assert httpx.get(rm_engine.base_url + "/v1/models").json()["data"][0]["id"] == "rm"
    unknown = httpx.post(rm_engine.base_url + "/classify", json={"model": "x", "input": "a"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    empty = httpx.post(rm_engine.base_url + "/classify", json={"input": []})
    assert empty.status_code == 400


async def test_the_rm_source_scores_answers_through_the_served_model(
    rm_engine: EngineProcess,
) -> None:
    rm = {"use": "rm", "url": rm_engine.base_url + "/v1", "model": "rm", "positive_label": 1}
    sources = load_sources(WorkerSettings(rewards=[rm]))
    try:
        scores = {}
        for answer in ["It is 42.", "It is 41."]:
            (turn,) = stitch_session(
                [
                    s.model_copy(update={"response": _answer(s, answer)})
                    for s in chat("rm", ["What is 6 * 7?"])
                ],
                closed="session_ended",
            )
            (scored,) = await score_all(sources, turn, {})
            assert scored.error is None, scored.error
            scores[answer] = scored
        assert scores["It is 42."].score > 0.5 > -0.5 > scores["It is 41."].score
        assert scores["It is 42."].explanation.startswith("label good, p=")
    finally:
        for s in sources:
            await s.aclose()


def _answer(step, text: str):
    from claw_stream.events import ChatMessage

    return step.response.model_copy(update={"message": ChatMessage(role="assistant", content=text)})
