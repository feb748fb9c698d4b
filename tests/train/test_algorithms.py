"""The trainer's math against values worked out by hand on small cases."""

from __future__ import annotations

import math

import pytest
import torch

from agentboost.errors import ConfigError
from agentboost.train import algorithms


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(
        torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), atol=atol, rtol=0
    )


# --- advantages ------------------------------------------------------------------------------------


def test_grpo_subtracts_the_group_mean_and_divides_by_the_unbiased_group_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.5, std = sqrt(4 * 0.25 / 3) = 0.57735; group 1: all equal -> 0
    close(
        algorithms.grpo_advantages(rewards, groups),
        [0.866025, -0.866025, -0.866025, 0.866025, 0.0, 0.0],
    )
    close(
        algorithms.grpo_advantages(rewards, groups, normalize_std=False),
        [0.5, -0.5, -0.5, 0.5, 0.0, 0.0],
    )


def test_rloo_uses_the_mean_of_the_other_samples():
    rewards = torch.tensor([1.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1])
    # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice); a group of one has no baseline: 0
    close(algorithms.rloo_advantages(rewards, groups), [1.0, -0.5, -0.5, 0.0])


def test_reinforce_pp_whitens_group_centred_rewards_over_the_batch():
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    # centred: [0.5, -0.5, 1, -1]; batch mean 0, std = sqrt(2.5 / 3) = 0.912871
    close(algorithms.reinforce_pp_advantages(rewards, groups), [0.547723, -0.547723, 1.095445, -1.095445])


def test_compute_advantages_dispatches_and_rejects_unknown_names():
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    close(algorithms.compute_advantages(rewards, groups, "rloo"), [1.0, -1.0])
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        algorithms.compute_advantages(rewards, groups, "ppo")  # type: ignore[arg-type]


def test_zero_signal_groups_are_those_with_equal_rewards_or_one_sample():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2])
    assert algorithms.zero_signal_samples(rewards, groups).tolist() == [True, True, False, False, True]


# --- per-token quantities --------------------------------------------------------------------------


def test_token_logprobs_follow_the_engine_convention_log_softmax_of_tempered_logits():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    targets = torch.tensor([0, 2])
    expected = torch.log_softmax(logits / 0.7, dim=-1)[torch.arange(2), targets]
    close(algorithms.token_logprobs(logits, targets, temperature=0.7), expected)


def test_entropy_of_a_uniform_distribution_is_log_v():
    close(algorithms.entropy_from_logits(torch.zeros(2, 8)), [math.log(8)] * 2)


def test_kl_estimators_by_hand():
    logprobs, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    log2 = math.log(2)
    close(algorithms.kl_penalty(logprobs, ref, "k1"), [log2])
    close(algorithms.kl_penalty(logprobs, ref, "k2"), [0.5 * log2**2])
    close(algorithms.kl_penalty(logprobs, ref, "k3"), [0.5 + log2 - 1])  # ref/pi - log(ref/pi) - 1
    close(algorithms.kl_penalty(ref, ref, "k3"), [0.0])


def test_truncated_importance_weights_are_capped_and_detached():
    trainer = torch.tensor([0.0, math.log(3.0)], requires_grad=True)
    weights = algorithms.truncated_importance_weights(trainer, torch.tensor([math.log(2.0), 0.0]), cap=2.0)
    close(weights, [0.5, 2.0])
    assert not weights.requires_grad


def test_mismatch_is_zero_for_identical_logprobs_and_adds_up_over_loss_tokens_only():
    trainer = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[True, True, False]])
    same = algorithms.logprob_mismatch(trainer, trainer.clone(), mask)
    assert float(same["abs_diff"]) == 0 and float(same["kl"]) == 0 and int(same["tokens"]) == 2
    rollout = torch.tensor([[-1.1, -2.0, 50.0]])  # the masked position must not count
    found = algorithms.logprob_mismatch(trainer, rollout, mask)
    close(found["abs_diff"], 0.1)
    close(found["max_abs_diff"], 0.1)
    close(found["kl"], math.exp(0.1) - 1 - 0.1)


# --- aggregation -----------------------------------------------------------------------------------


def test_token_mean_and_sequence_mean_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    close(algorithms.aggregate(per_token, mask, "token_mean"), (1 + 2 + 4) / 3)
    close(algorithms.aggregate(per_token, mask, "sequence_mean"), (1.5 + 4.0) / 2)


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean"])
def test_micro_batches_with_the_mini_batch_normalizer_add_up_to_the_whole(mode):
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0], [6.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
    whole = algorithms.aggregate(per_token, mask, mode)
    normalizer = 6 if mode == "token_mean" else 3
    parts = algorithms.aggregate(per_token[:1], mask[:1], mode, normalizer) + algorithms.aggregate(
        per_token[1:], mask[1:], mode, normalizer
    )
    close(parts, whole)


# --- the clipped policy loss -----------------------------------------------------------------------


def _loss_and_grad(ratios, advantage, **options):
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    logprobs = (old + torch.log(torch.tensor([ratios]))).requires_grad_()
    mask = torch.ones(1, 3, dtype=torch.bool)
    result = algorithms.policy_loss(logprobs, old, torch.tensor([advantage]), mask, **options)
    result.loss.backward()
    return result, logprobs.grad[0]


def test_positive_advantage_is_clipped_at_the_upper_bound_only():
    # A = +1, ratios 1.0, 1.5, 0.5, bounds [0.8, 1.28]: min(r, clip(r)) = 1, 1.28 (clipped), 0.5
    result, grad = _loss_and_grad([1.0, 1.5, 0.5], 1.0, clip_low=0.2, clip_high=0.28)
    close(result.loss, -(1.0 + 1.28 + 0.5) / 3)
    # d(-r)/d(log pi) = -r where the ratio term is active; the clipped token gets no gradient
    close(grad, [-1.0 / 3, 0.0, -0.5 / 3])
    assert result.clipped_high.tolist() == [[False, True, False]]
    assert not result.clipped_low.any()


def test_negative_advantage_is_clipped_at_the_lower_bound_only():
    # A = -1: min(-r, -clip(r)) = -1, -1.5 (not clipped: the bad token was made likelier), -0.8 (clipped)
    result, grad = _loss_and_grad([1.0, 1.5, 0.5], -1.0, clip_low=0.2, clip_high=0.28)
    close(result.loss, (1.0 + 1.5 + 0.8) / 3)
    close(grad, [1.0 / 3, 1.5 / 3, 0.0])
    assert result.clipped_low.tolist() == [[False, False, True]]
    assert not result.clipped_high.any()


def test_separate_bounds_are_really_separate():
    # ratio 1.25 is inside [1 - 0.2, 1 + 0.28] but outside a symmetric 0.2 clip
    wide, grad_wide = _loss_and_grad([1.25, 1.0, 1.0], 1.0, clip_low=0.2, clip_high=0.28)
    narrow, grad_narrow = _loss_and_grad([1.25, 1.0, 1.0], 1.0, clip_low=0.2, clip_high=0.2)
    close(wide.loss, -(1.25 + 1 + 1) / 3)
    close(narrow.loss, -(1.2 + 1 + 1) / 3)
    assert grad_wide[0] != 0 and grad_narrow[0] == 0


def test_kl_penalty_and_importance_weights_enter_the_loss():
    old = torch.zeros(1, 2)
    logprobs = torch.tensor([[math.log(0.5), math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    # ratio = 0.5 at both tokens, A = 0: the surrogate is 0, the loss is the KL term alone
    result = algorithms.policy_loss(
        logprobs, old, torch.tensor([0.0]), mask, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k3"
    )
    close(result.loss, 0.1 * (0.5 + math.log(2) - 1 + 0.0) / 2)
    weighted = algorithms.policy_loss(
        torch.zeros(1, 2), old, torch.tensor([1.0]), mask, importance_weights=torch.tensor([[0.5, 2.0]])
    )
    close(weighted.loss, -(0.5 + 2.0) / 2)


def test_tokens_with_loss_mask_zero_get_exactly_zero_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)  # [B, T, V]
    targets = torch.randint(0, 11, (2, 5))
    mask = torch.tensor([[False, True, True, False, False], [True, False, True, True, False]])
    logprobs = algorithms.token_logprobs(logits.view(-1, 11), targets.view(-1)).view(2, 5)
    # garbage where the mask is 0: huge or infinite old logprobs, -inf reference, NaN rollout weights
    old = torch.where(mask, logprobs.detach() - 0.1, torch.full_like(logprobs, 1e4))
    ref = torch.where(mask, logprobs.detach() + 0.2, torch.full_like(logprobs, -math.inf))
    weights = torch.where(mask, torch.ones_like(logprobs), torch.full_like(logprobs, math.nan))
    for aggregation in ("token_mean", "sequence_mean"):
        logits.grad = None
        result = algorithms.policy_loss(
            logprobs,
            old,
            torch.tensor([1.0, -2.0]),
            mask,
            aggregation=aggregation,
            ref_logprobs=ref,
            kl_coef=0.5,
            importance_weights=weights,
        )
        assert torch.isfinite(result.loss)
        result.loss.backward(retain_graph=True)
        grad = logits.grad
        assert torch.isfinite(grad).all()
        assert torch.count_nonzero(grad[~mask]) == 0  # exactly zero, not just small
        assert grad[mask].abs().sum(-1).min() > 0  # and every generated token does get a gradient


def _off_policy_case():
    """Three sequences, log pi_old - log pi_rollout per token chosen by hand (the last column of rows 1
    and 2 is off the mask, with a value that would matter if it leaked in)."""
    ratios = torch.tensor([[3.0, 1.0, 0.25], [0.5, 2.0, 1e6], [4.0, 4.0, 1e-6]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, False]])
    rollout = torch.full((3, 3), -1.5)
    return rollout + ratios.log(), rollout, mask


def test_off_policy_tis_truncates_token_ratios_at_the_cap():
    old, rollout, mask = _off_policy_case()
    found = algorithms.off_policy_weights(old, rollout, mask, "tis", cap=2.0)
    assert torch.allclose(found.weights[mask], torch.tensor([2.0, 1.0, 0.25, 0.5, 2.0, 2.0, 2.0]))
    assert found.truncated.tolist() == [[True, False, False], [False, False, False], [True, True, False]]
    assert not found.masked.any()


def test_off_policy_mis_weighs_each_sequence_by_its_geometric_mean_ratio_and_masks_outside_the_band():
    old, rollout, mask = _off_policy_case()
    found = algorithms.off_policy_weights(old, rollout, mask, "mis", low=0.5, high=2.0)
    first = (3.0 * 1.0 * 0.25) ** (1 / 3)  # 0.9086: inside [0.5, 2]
    assert torch.allclose(found.weights[0], torch.full((3,), first))
    assert torch.allclose(found.weights[1, :2], torch.ones(2))  # sqrt(0.5 * 2) = 1
    assert found.weights[2].tolist() == [0.0, 0.0, 0.0]  # sqrt(4 * 4) = 4 > 2: the whole sequence masked
    assert found.masked.tolist() == [[False] * 3, [False] * 3, [True, True, False]]
    assert not found.truncated.any()


def test_off_policy_icepop_masks_tokens_outside_the_band_and_weighs_the_rest_by_their_ratio():
    old, rollout, mask = _off_policy_case()
    found = algorithms.off_policy_weights(old, rollout, mask, "icepop", low=0.5, high=2.0)
    assert torch.allclose(found.weights[mask], torch.tensor([0.0, 1.0, 0.0, 0.5, 2.0, 0.0, 0.0]))
    assert found.masked.tolist() == [[True, False, True], [False, False, False], [True, True, False]]
    none = algorithms.off_policy_weights(old, rollout, mask, "none")
    assert torch.equal(none.weights, torch.ones(3, 3)) and not none.masked.any()
    with pytest.raises(ConfigError, match="unknown off-policy correction"):
        algorithms.off_policy_weights(old, rollout, mask, "seq")


def test_ratio_quantiles_of_the_engine_trainer_gap():
    found = algorithms.ratio_quantiles(
        [torch.tensor([math.log(0.5), 0.0]), torch.tensor([0.0, math.log(2.0)])]
    )
    assert found["mismatch/ratio_min"] == pytest.approx(0.5)
    assert found["mismatch/ratio_p50"] == pytest.approx(1.0)
    assert found["mismatch/ratio_max"] == pytest.approx(2.0)
    assert 1.0 < found["mismatch/ratio_p99"] < 2.0
    assert algorithms.ratio_quantiles([]) == {
        f"mismatch/ratio_{name}": 1.0 for name in ("min", "p01", "p50", "p99", "max")
    }
