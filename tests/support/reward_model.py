"""A tiny discriminative reward model: a Llama sequence classifier (SmolLM2's tokenizer)
trained in seconds to prefer answers that give 42 to the question of 6 * 7."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForSequenceClassification

from claw_stream.worker.logic.turns import stitch_session
from claw_stream.worker.reward_sources import rm_text

from .engine import tiny_config
from .worker import step

GOOD = ["It is 42.", "6 * 7 = 42", "42"]
BAD = ["It is 41.", "I do not know.", "Maybe 12?"]


def conversation(answer: str) -> str:
    """What the `rm` source sends for a one-turn session with this answer."""
    from claw_stream.events import ChatMessage

    s = step(
        "rm",
        0,
        [ChatMessage(role="user", content="What is 6 * 7?")],
        ChatMessage(role="assistant", content=answer),
    )
    (turn,) = stitch_session([s], closed="session_ended")
    return rm_text(turn)


def make_reward_model(folder: Path, tokenizer_dir: Path, steps: int = 60) -> Path:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = tiny_config(len(tokenizer))
    config.num_labels = 2
    config.id2label, config.label2id = {0: "bad", 1: "good"}, {"bad": 0, "good": 1}
    config.pad_token_id = tokenizer.pad_token_id or 0
    model = LlamaForSequenceClassification(config)
    texts = [conversation(a) for a in GOOD + BAD]
    labels = torch.tensor([1] * len(GOOD) + [0] * len(BAD))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = torch.zeros(())
        for text, label in zip(texts, labels, strict=True):
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            loss = loss + torch.nn.functional.cross_entropy(
                model(input_ids=ids).logits, label[None]
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mean = float(loss.detach()) / len(texts)
    assert mean < 0.05, f"the reward model did not learn (loss {mean:.3f})"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
