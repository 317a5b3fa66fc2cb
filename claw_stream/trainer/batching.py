"""Samples -> padded tensors, in micro-batches that fit a token budget."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from claw_stream.events import Sample


@dataclass
class MicroBatch:
    samples: list[Sample]
    input_ids: torch.Tensor  # [B, L] prompt + response, left-padded
    attention_mask: torch.Tensor  # [B, L]
    positions: torch.Tensor  # [B, T] index (in the kept logits) of the one predicting token t
    targets: torch.Tensor  # [B, T] response token ids
    mask: torch.Tensor  # [B, T] 1 where a response token is trained
    behaviour: torch.Tensor  # [B, T]
    teacher: torch.Tensor | None  # [B, T]
    rewards: torch.Tensor  # [B]
    logits_to_keep: int = 0  # logits are needed only for this many last positions

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device) -> MicroBatch:
        def move(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.to(device)

        return MicroBatch(
            samples=self.samples,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            positions=self.positions.to(device),
            targets=self.targets.to(device),
            mask=self.mask.to(device),
            behaviour=self.behaviour.to(device),
            teacher=move(self.teacher),
            rewards=self.rewards.to(device),
            logits_to_keep=self.logits_to_keep,
        )


def micro_batches(samples: list[Sample], token_budget: int) -> Iterator[list[Sample]]:
    """Consecutive groups whose padded size (rows x longest row) stays within the budget."""
    group: list[Sample] = []
    longest = 0
    for sample in samples:
        length = len(sample.prompt_token_ids) + len(sample.response_token_ids)
        if group and max(longest, length) * (len(group) + 1) > token_budget:
            yield group
            group, longest = [], 0
        group.append(sample)
        longest = max(longest, length)
    if group:
        yield group


def collate(
    samples: list[Sample], pad_id: int, *, rewards: list[float] | None = None
) -> MicroBatch:
    """Left-padded rows, so every response ends in the last column and only the last
    `logits_to_keep` positions need logits (the LM head is a large share of a small model)."""
    lengths = [len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples]
    longest = max(lengths)
    keep = max(len(s.response_token_ids) for s in samples) + 1
    b = len(samples)
    input_ids = torch.full((b, longest), pad_id, dtype=torch.long)
    attention = torch.zeros((b, longest), dtype=torch.long)
    positions = torch.zeros((b, keep - 1), dtype=torch.long)
    targets = torch.zeros((b, keep - 1), dtype=torch.long)
    mask = torch.zeros((b, keep - 1))
    behaviour = torch.zeros((b, keep - 1))
    has_teacher = all(s.teacher_logprobs is not None for s in samples)
    teacher = torch.zeros((b, keep - 1)) if has_teacher else None
    for i, s in enumerate(samples):
        ids = s.prompt_token_ids + s.response_token_ids
        n_resp = len(s.response_token_ids)
        input_ids[i, longest - len(ids) :] = torch.tensor(ids)
        attention[i, longest - len(ids) :] = 1
        # the logit predicting response token t sits at window index keep - n_resp - 1 + t
        positions[i, :n_resp] = torch.arange(keep - n_resp - 1, keep - 1)
        targets[i, :n_resp] = torch.tensor(s.response_token_ids)
        mask[i, :n_resp] = 1
        behaviour[i, :n_resp] = torch.tensor(s.response_logprobs)
        if teacher is not None and s.teacher_logprobs is not None:
            teacher[i, :n_resp] = torch.tensor(s.teacher_logprobs)
    reward_values = rewards if rewards is not None else [s.reward for s in samples]
    return MicroBatch(
        samples=samples,
        input_ids=input_ids,
        attention_mask=attention,
        positions=positions,
        targets=targets,
        mask=mask,
        behaviour=behaviour,
        teacher=teacher,
        rewards=torch.tensor(reward_values, dtype=torch.float32),
        logits_to_keep=keep,
    )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token (rows are left-padded)."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def token_logprobs(logits: torch.Tensor, batch: MicroBatch) -> torch.Tensor:
    """log pi(target_t) for each response position: [B, T], from the kept logits [B, keep, V]."""
    vocab = logits.shape[-1]
    picked = torch.gather(logits, 1, batch.positions.unsqueeze(-1).expand(-1, -1, vocab))
    nll = torch.nn.functional.cross_entropy(
        picked.float().reshape(-1, vocab), batch.targets.reshape(-1), reduction="none"
    )
    return -nll.view(batch.targets.shape)
