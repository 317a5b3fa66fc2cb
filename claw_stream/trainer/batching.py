"""Samples -> padded tensors, in micro-batches that fit a token budget."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from claw_stream.events import Sample


@dataclass
class MicroBatch:
    samples: list[Sample]
    input_ids: torch.Tensor  # [R, L] prompt + response, left-padded; R <= B when packed
    attention_mask: torch.Tensor  # [R, L]
    positions: torch.Tensor  # [B, T] index (in the kept logits) of the one predicting token t
    targets: torch.Tensor  # [B, T] response token ids
    mask: torch.Tensor  # [B, T] 1 where a response token is trained
    behaviour: torch.Tensor  # [B, T]
    teacher: torch.Tensor | None  # [B, T]
    rewards: torch.Tensor  # [B]
    logits_to_keep: int | torch.Tensor = 0  # the last N columns, or these columns
    rows: torch.Tensor | None = None  # [B] the input row of each sample (packed rows hold several)
    without_skills: torch.Tensor | None = None  # [B] its answer was sampled with skills it lacks

    @property
    def n_tokens(self) -> int:
        """Tokens the forward pass processes (padding aside)."""
        return int(self.attention_mask.sum())

    @property
    def n_trained(self) -> int:
        """Answer tokens trained."""
        return int(self.mask.sum())

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
            logits_to_keep=(
                self.logits_to_keep
                if isinstance(self.logits_to_keep, int)
                else self.logits_to_keep.to(device)
            ),
            rows=move(self.rows),
            without_skills=move(self.without_skills),
        )


@dataclass
class Pack:
    """One row of a forward pass: the longest member's prompt + response, and the samples
    whose own prompt + response is a prefix of it (a session's turns, when each prompt extends
    the one before). Causal attention makes each member's answer see exactly the prompt it was
    sampled with, so one pass yields the log-probs of every member."""

    ids: list[int]
    members: list[Sample]


def _full(sample: Sample) -> list[int]:
    return sample.prompt_token_ids + sample.response_token_ids


def pack_samples(
    samples: list[Sample], *, enabled: bool = True, max_tokens: int | None = None
) -> tuple[list[Pack], int]:
    """The samples in packs, and how many could not join a pack of their session (a prompt
    that rewrote the history, a side call, or a row that would pass `max_tokens`: such a
    session is split at a turn boundary, never an answer cut). Off: one pack per sample."""
    if not enabled:
        return [Pack(_full(s), [s]) for s in samples], 0
    by_session: dict[str, list[Sample]] = {}
    for sample in samples:
        by_session.setdefault(sample.session_id, []).append(sample)
    packs: list[Pack] = []
    fallbacks = 0
    for members in by_session.values():
        open_packs: list[Pack] = []
        for sample in sorted(
            members, key=lambda s: len(s.prompt_token_ids) + len(s.response_token_ids)
        ):
            full = _full(sample)
            for pack in open_packs:
                n = len(pack.ids)
                if full[:n] == pack.ids and (max_tokens is None or len(full) <= max_tokens):
                    pack.ids = full  # the sample extends the row
                    pack.members.append(sample)
                    break
                if len(full) <= n and pack.ids[: len(full)] == full:
                    pack.members.append(sample)  # the row holds it already
                    break
            else:
                fallbacks += bool(open_packs)
                open_packs.append(Pack(full, [sample]))
        packs.extend(open_packs)
    return packs, fallbacks


def micro_batches(packs: list[Pack], token_budget: int) -> Iterator[list[Pack]]:
    """Consecutive groups whose padded size (rows x longest row) stays within the budget."""
    group: list[Pack] = []
    longest = 0
    for pack in packs:
        length = len(pack.ids)
        if group and max(longest, length) * (len(group) + 1) > token_budget:
            yield group
            group, longest = [], 0
        group.append(pack)
        longest = max(longest, length)
    if group:
        yield group


def collate(
    packs: list[Pack] | list[Sample], pad_id: int, *, rewards: list[float] | None = None
) -> MicroBatch:
    """Left-padded rows (one per pack), so the newest answer of every row ends in the last
    column. Logits are computed only at the columns that predict a trained token: the last
    `logits_to_keep` columns when those are all (unpacked rows), else the listed columns (the
    LM head is a large share of a small model, and a packed row of 10k tokens would otherwise
    need logits for every column). `rewards` follow the members in pack order."""
    rows = [p if isinstance(p, Pack) else Pack(_full(p), [p]) for p in packs]
    samples = [s for p in rows for s in p.members]
    longest = max(len(p.ids) for p in rows)
    width = max(len(s.response_token_ids) for s in samples)
    n_rows, n = len(rows), len(samples)
    input_ids = torch.full((n_rows, longest), pad_id, dtype=torch.long)
    attention = torch.zeros((n_rows, longest), dtype=torch.long)
    row_of = torch.zeros(n, dtype=torch.long)
    columns = torch.zeros((n, width), dtype=torch.long)
    targets = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width))
    behaviour = torch.zeros((n, width))
    has_teacher = all(s.teacher_logprobs is not None for s in samples)
    teacher = torch.zeros((n, width)) if has_teacher else None
    i = 0
    for r, pack in enumerate(rows):
        offset = longest - len(pack.ids)
        input_ids[r, offset:] = torch.tensor(pack.ids)
        attention[r, offset:] = 1
        for s in pack.members:
            n_resp, start = len(s.response_token_ids), offset + len(s.prompt_token_ids)
            row_of[i] = r
            # the logit predicting response token t sits in the column before it
            columns[i, :n_resp] = torch.arange(start - 1, start - 1 + n_resp)
            targets[i, :n_resp] = torch.tensor(s.response_token_ids)
            mask[i, :n_resp] = 1
            behaviour[i, :n_resp] = torch.tensor(s.response_logprobs)
            if teacher is not None and s.teacher_logprobs is not None:
                teacher[i, :n_resp] = torch.tensor(s.teacher_logprobs)
            i += 1
    needed = torch.unique(columns[mask.bool()])
    first = int(needed.min())
    if len(needed) == int(needed.max()) - first + 1 and int(needed.max()) >= longest - 2:
        keep: int | torch.Tensor = longest - first  # the last columns, as a plain count
        positions = columns - first
    else:
        keep = needed
        positions = torch.searchsorted(needed, columns)
    positions = positions.clamp(0, (keep if isinstance(keep, int) else len(keep)) - 1)
    reward_values = rewards if rewards is not None else [s.reward for s in samples]
    return MicroBatch(
        samples=samples,
        input_ids=input_ids,
        attention_mask=attention,
        positions=positions * mask.long(),
        targets=targets,
        mask=mask,
        behaviour=behaviour,
        teacher=teacher,
        rewards=torch.tensor(reward_values, dtype=torch.float32),
        logits_to_keep=keep,
        rows=row_of,
        without_skills=torch.tensor([s.without_skills for s in samples], dtype=torch.bool),
    )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token (rows are left-padded)."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def token_logprobs(logits: torch.Tensor, batch: MicroBatch) -> torch.Tensor:
    """log pi(target_t) for each response position: [B, T], from the kept logits [B, keep, V]."""
    vocab = logits.shape[-1]
    if batch.rows is not None and len(batch.rows) != logits.shape[0]:  # packed rows
        picked = logits[batch.rows.unsqueeze(1), batch.positions]
    else:
        picked = torch.gather(logits, 1, batch.positions.unsqueeze(-1).expand(-1, -1, vocab))
    nll = torch.nn.functional.cross_entropy(
        picked.float().reshape(-1, vocab), batch.targets.reshape(-1), reduction="none"
    )
    return -nll.view(batch.targets.shape)
