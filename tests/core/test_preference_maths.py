"""Hand-worked numbers for the preference maths in comlrl.core.preference."""

import math

import pytest
import torch
from torch.testing import assert_close

from comlrl.core.preference import (
    bradley_terry_loss,
    joint_margin_loss,
    order_pairs,
    preference_accuracy,
    replay_allocation,
    replay_sample_size,
    replay_weights,
    select_candidate_pairs,
    select_comparisons,
    shard_draw,
    strict_pairs,
)


def log_sigmoid(x):
    return -math.log1p(math.exp(-x))


def test_bradley_terry_loss_by_hand():
    # pair 0: s_w - s_l = 2 - 0 = 2 -> -log sigmoid(2) = log(1 + e^-2) = 0.126928
    # pair 1: s_w - s_l = 0 - 1 = -1 -> -log sigmoid(-1) = log(1 + e^1) = 1.313262
    # mean = 0.720095
    loss = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert_close(loss, torch.tensor((math.log1p(math.exp(-2)) + math.log1p(math.exp(1))) / 2))
    assert abs(float(loss) - 0.720095) < 5e-7 + 4 * 2**-23  # the 6-decimal value, and float32 rounding of 4 operations at ~1


def test_bradley_terry_gradient_raises_the_winner():
    s_w = torch.tensor([0.5], requires_grad=True)
    s_l = torch.tensor([0.5], requires_grad=True)
    bradley_terry_loss(s_w, s_l).backward()
    # d/ds_w -log sigmoid(s_w - s_l) = -sigmoid(-(s_w - s_l)) = -0.5 at a zero margin
    assert_close(s_w.grad, torch.tensor([-0.5]))
    assert_close(s_l.grad, torch.tensor([0.5]))


def test_joint_margin_loss_sums_agent_margins():
    # two agents, two pairs; Delta_agent0 = [1, -2], Delta_agent1 = [3, 1] -> sum = [4, -1]
    # beta = 0.5 -> beta * sum = [2, -0.5]; loss = mean(-log sigmoid([2, -0.5]))
    delta0 = torch.tensor([1.0, -2.0])
    delta1 = torch.tensor([3.0, 1.0])
    loss = joint_margin_loss(delta0 + delta1, beta=0.5)
    expected = -(log_sigmoid(2.0) + log_sigmoid(-0.5)) / 2
    assert_close(loss, torch.tensor(expected))
    assert_close(preference_accuracy(delta0 + delta1), torch.tensor(0.5))


def test_agent_wise_step_has_the_joint_gradient():
    # Stepping agent 0 with agent 1's margin detached gives agent 0's gradient of the joint loss:
    # dL/dDelta_0 = -beta * sigmoid(-beta * (Delta_0 + Delta_1)) / B
    delta0 = torch.tensor([1.0, -2.0], requires_grad=True)
    delta1 = torch.tensor([3.0, 1.0])
    joint_margin_loss(delta0 + delta1.detach(), beta=0.5).backward()
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = torch.tensor([-0.5 * sig(-2.0) / 2, -0.5 * sig(0.5) / 2])
    assert_close(delta0.grad, expected)


def test_strict_pairs_drop_ties_and_nan():
    # r = [1, 3, 3, nan]: strict wins are (1, 0) and (2, 0); 1 vs 2 tie; nan pairs nothing
    pairs = strict_pairs(torch.tensor([1.0, 3.0, 3.0, float("nan")]))
    assert pairs.tolist() == [[1, 0], [2, 0]]


def test_reward_gap_order_is_by_gap_then_index():
    # r = [0, 2, 1]: strict pairs in (i, j) order: (1,0) gap 2, (1,2) gap 1, (2,0) gap 1
    # by gap descending, stable: (1,0), (1,2), (2,0)
    pairs = select_candidate_pairs(torch.tensor([0.0, 2.0, 1.0]), "reward_gap", None)
    assert pairs.tolist() == [[1, 0], [1, 2], [2, 0]]
    assert select_candidate_pairs(torch.tensor([0.0, 2.0, 1.0]), "reward_gap", 2).tolist() == [[1, 0], [1, 2]]


def test_all_keeps_index_order_and_random_is_a_permutation():
    rewards = torch.tensor([0.0, 2.0, 1.0, 3.0])
    everything = select_candidate_pairs(rewards, "all", None)
    assert everything.tolist() == [[1, 0], [1, 2], [2, 0], [3, 0], [3, 1], [3, 2]]
    generator = torch.Generator().manual_seed(0)
    shuffled = select_candidate_pairs(rewards, "random", None, generator)
    assert sorted(map(tuple, shuffled.tolist())) == sorted(map(tuple, everything.tolist()))
    assert shuffled.tolist() != everything.tolist()  # this seed does move them
    with pytest.raises(ValueError, match="pair_selection"):
        select_candidate_pairs(rewards, "comparator_reward", None)


def test_comparisons_by_comparator_reward_then_gap():
    # target    [1, 0, 2, 5, 3]
    # comparator[0, 1, 2, 4, 1]  -> gaps [1, -1, 0 (dropped), 1, 2]
    # candidates j = 0, 1, 3, 4 with comparator rewards 0, 1, 4, 1 and |gap| 1, 1, 1, 2
    # comparator_reward: 3 (4), then 4 (1, |gap| 2) before 1 (1, |gap| 1), then 0
    target = torch.tensor([1.0, 0.0, 2.0, 5.0, 3.0])
    comparator = torch.tensor([0.0, 1.0, 2.0, 4.0, 1.0])
    assert select_comparisons(target, comparator, "comparator_reward", None).tolist() == [3, 4, 1, 0]
    # reward_gap: 4 (|gap| 2) first, then 0, 1, 3 in index order
    assert select_comparisons(target, comparator, "reward_gap", None).tolist() == [4, 0, 1, 3]
    assert select_comparisons(target, comparator, "all", 2).tolist() == [0, 1]
    # only the first min(K, K_c) candidates are compared
    assert select_comparisons(target, comparator[:2], "all", None).tolist() == [0, 1]


def test_order_pairs_rejects_unknown_modes():
    with pytest.raises(ValueError, match="pair selection"):
        order_pairs(torch.tensor([1.0]), "best")


def test_replay_weights_by_hand():
    sizes = [3, 0, 2, 4]  # oldest first; shard 1 is empty
    # current: the newest non-empty (index 3)
    assert_close(replay_weights(sizes, "current"), torch.tensor([0.0, 0.0, 0.0, 1.0]))
    # nearest_k with k = 2: the two newest non-empty shards (3 and 2), equally
    assert_close(replay_weights(sizes, "nearest_k", k=2), torch.tensor([0.0, 0.0, 0.5, 0.5]))
    # all_history: the three non-empty shards equally
    assert_close(replay_weights(sizes, "all_history"), torch.tensor([1 / 3, 0.0, 1 / 3, 1 / 3]))
    # lambda_decay, lam = 0.5: ages 0 (shard 3), 1 (shard 2), 2 (shard 0) -> 1, 0.5, 0.25 over 1.75
    assert_close(replay_weights(sizes, "lambda_decay", lam=0.5), torch.tensor([0.25 / 1.75, 0.0, 0.5 / 1.75, 1 / 1.75]))
    # lam = 0: the newest only (0^0 = 1); lam = 1: uniform over the non-empty shards
    assert_close(replay_weights(sizes, "lambda_decay", lam=0.0), torch.tensor([0.0, 0.0, 0.0, 1.0]))
    assert_close(replay_weights(sizes, "lambda_decay", lam=1.0), replay_weights(sizes, "all_history"))
    assert_close(replay_weights([0, 0], "all_history"), torch.zeros(2))


def test_replay_sample_sizes():
    assert replay_sample_size(7, 3, [1, 2]) == 7  # configured wins
    assert replay_sample_size(None, 3, [1, 2]) == 3  # this round's pair count
    assert replay_sample_size(None, 0, [5, 2, 0]) == 2  # the newest non-empty shard
    assert replay_sample_size(None, 0, [0, 0]) == 0


def test_replay_allocation_and_shard_draws():
    generator = torch.Generator().manual_seed(1)
    counts = replay_allocation(torch.tensor([0.0, 0.25, 0.75]), 400, generator)
    assert int(counts.sum()) == 400 and int(counts[0]) == 0
    assert 60 < int(counts[1]) < 140  # ~ 100 expected
    assert replay_allocation(torch.zeros(2), 5).tolist() == [0, 0]
    # a shard of 3 pairs asked for 7: two whole shuffled copies (6) and one more distinct pair
    draw = shard_draw(3, 7, generator)
    assert len(draw) == 7 and sorted(draw[:3].tolist()) == [0, 1, 2] and sorted(draw[3:6].tolist()) == [0, 1, 2]
    # asked for 2 of 5: two distinct pairs
    small = shard_draw(5, 2, generator)
    assert len(set(small.tolist())) == 2
