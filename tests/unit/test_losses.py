"""Every trainer loss against values computed by hand on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from claw_stream.trainer.losses import LossConfig, advantages, normalise_rewards, policy_loss

CFG = LossConfig()


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def run(new, old, behaviour, advantage, mask=None, config=CFG, ref=None):
    new = new.clone().requires_grad_(True)
    mask = torch.ones_like(new) if mask is None else mask
    out = policy_loss(config, new, old, behaviour, advantage, mask, ref)
    out.loss.backward()
    return out, new.grad


def test_unclipped_ratio_one_gives_minus_advantage_and_its_gradient() -> None:
    lp = t([-1.0, -2.0])
    out, grad = run(lp, lp, lp, t([1.0, 1.0]))
    assert out.loss.item() == pytest.approx(-1.0)
    assert grad[0].tolist() == pytest.approx([-0.5, -0.5])  # d/dnew of -mean(ratio·A), ratio = 1
    assert out.clip_fraction == 0 and out.approx_kl == 0


def test_clip_high_side_for_positive_advantage() -> None:
    out, grad = run(t([0.5]), t([0.0]), t([0.0]), t([1.0]))
    assert out.loss.item() == pytest.approx(-(1 + CFG.eps_high))  # min(e^0.5, 1.28) = 1.28
    assert grad.item() == 0.0  # clipped: no gradient
    assert out.clip_fraction == 1.0


def test_clip_low_side_for_negative_advantage() -> None:
    out, grad = run(t([-0.5]), t([0.0]), t([0.0]), t([-1.0]))
    assert out.loss.item() == pytest.approx(1 - CFG.eps_low)  # min(-e^-0.5, -0.8) = -0.8
    assert grad.item() == 0.0
    assert out.clip_fraction == 1.0


def test_no_clip_where_it_would_help_the_objective() -> None:
    # negative advantage, ratio above the band: the unclipped term is the pessimistic one
    out, grad = run(t([0.5]), t([0.0]), t([0.0]), t([-1.0]))
    assert out.loss.item() == pytest.approx(math.exp(0.5))
    assert grad.item() == pytest.approx(math.exp(0.5))
    assert out.clip_fraction == 0.0


def test_zero_advantage_has_no_loss_and_no_gradient() -> None:
    out, grad = run(t([-1.0, -0.3]), t([-1.2, -0.3]), t([-1.0, -0.3]), t([0.0, 0.0]))
    assert out.loss.item() == 0.0
    assert grad.abs().sum().item() == 0.0


def test_masked_tokens_count_for_nothing_and_samples_average_their_own_tokens() -> None:
    new = t([-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0])
    adv = t([1.0, 3.0, 1000.0], [2.0, 1000.0, 1000.0])  # prompt/tool tokens carry junk
    mask = t([1, 1, 0], [1, 0, 0])
    out, grad = run(new, new, new, adv, mask)
    # sample 1: mean(-1, -3) = -2; sample 2: -2; batch: -2
    assert out.loss.item() == pytest.approx(-2.0)
    assert grad[0, 2].item() == 0.0 and grad[1, 1:].abs().sum().item() == 0.0
    assert grad[0, :2].tolist() == pytest.approx([-0.5 / 2, -3 / 2 / 2])
    assert grad[1, 0].item() == pytest.approx(-2 / 2)


def test_a_sample_with_no_trained_tokens_does_not_dilute_the_batch() -> None:
    new = t([-1.0, -1.0], [-1.0, -1.0])
    out, _ = run(new, new, new, t([1.0, 1.0], [5.0, 5.0]), t([1, 1], [0, 0]))
    assert out.loss.item() == pytest.approx(-1.0)


def test_importance_weight_is_truncated() -> None:
    old = t([math.log(0.5), math.log(0.5)])
    behaviour = t([math.log(0.1), math.log(0.4)])  # weights 5 (capped to 2) and 1.25
    out, grad = run(old, old, behaviour, t([1.0, 1.0]))
    assert out.loss.item() == pytest.approx(-(2.0 + 1.25) / 2)
    assert grad[0].tolist() == pytest.approx([-1.0, -0.625])
    assert out.is_weight_max == pytest.approx(2.0) and out.is_weight_mean == pytest.approx(1.625)


def test_opd_and_combine_advantages() -> None:
    old = t([-1.0, -2.0])
    teacher = t([-0.5, -3.0])
    rewards = torch.tensor([2.0], dtype=torch.float64)
    opd = advantages(LossConfig(method="opd"), rewards, old, teacher)
    assert opd.tolist() == [[0.5, -1.0]]
    combine = advantages(LossConfig(method="combine", w_opd=1.0, w_rl=0.5), rewards, old, teacher)
    assert combine.tolist() == [[1.5, 0.0]]
    assert advantages(LossConfig(method="binary"), rewards, old, None).tolist() == [[2.0, 2.0]]
    with pytest.raises(ValueError, match="needs teacher"):
        advantages(LossConfig(method="opd"), rewards, old, None)


def test_reward_normalisation() -> None:
    rewards = torch.tensor([1.0, 0.0, 5.0], dtype=torch.float64)
    grouped = normalise_rewards(rewards, ["g", "g", None], "group")
    s = math.sqrt(0.5)  # sample std of (1, 0)
    assert grouped.tolist() == pytest.approx([0.5 / s, -0.5 / s, 5.0], rel=1e-5)
    batch = normalise_rewards(rewards, [None] * 3, "batch")
    assert batch.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert batch.std().item() == pytest.approx(1.0, rel=1e-5)
    assert normalise_rewards(rewards, ["g", None, None], "group").tolist() == rewards.tolist()


def test_kl_to_reference_k3() -> None:
    lp = t([-1.0])
    config = LossConfig(kl_coef=0.1)
    same, _ = run(lp, lp, lp, t([0.0]), config=config, ref=lp)
    assert same.loss.item() == 0.0
    lower, grad = run(lp, lp, lp, t([0.0]), config=config, ref=t([-2.0]))
    k3 = math.exp(-1.0) + 1.0 - 1.0
    assert lower.loss.item() == pytest.approx(0.1 * k3) and lower.kl_ref == pytest.approx(k3)
    assert grad.item() == pytest.approx(
        0.1 * (1 - math.exp(-1.0))
    )  # d/dnew of k3 = 1 - e^(ref-new)
