"""Pure tensor maths: baselines, normalisation, returns, TD targets, losses, KL estimators,
preference losses, pair selection and replay sampling.

Nothing here knows about models, devices, configs or files; trainers call these functions.
"""

from comlrl.core.advantages import ADVANTAGE_MODES, group_advantages, normalize_flat, normalize_groups
from comlrl.core.kl import k3_token_kl, sequence_kl, sequence_log_ratio
from comlrl.core.losses import PolicyLossOutput, policy_gradient_loss, sequence_logprobs, value_loss
from comlrl.core.preference import (
    bradley_terry_loss,
    joint_margin_loss,
    preference_accuracy,
    replay_allocation,
    replay_sample_size,
    replay_weights,
    select_candidate_pairs,
    select_comparisons,
    shard_draw,
)
from comlrl.core.returns import cross_marginal_returns, node_returns, rewards_to_go, td_targets

__all__ = [
    "ADVANTAGE_MODES",
    "PolicyLossOutput",
    "bradley_terry_loss",
    "cross_marginal_returns",
    "group_advantages",
    "joint_margin_loss",
    "k3_token_kl",
    "node_returns",
    "normalize_flat",
    "normalize_groups",
    "policy_gradient_loss",
    "preference_accuracy",
    "replay_allocation",
    "replay_sample_size",
    "replay_weights",
    "rewards_to_go",
    "select_candidate_pairs",
    "select_comparisons",
    "sequence_kl",
    "sequence_log_ratio",
    "sequence_logprobs",
    "shard_draw",
    "td_targets",
    "value_loss",
]
