"""Pure tensor maths: baselines, normalisation, returns, TD targets, losses, KL estimators,
preference losses, pair selection and replay sampling.

Nothing here knows about models, devices, configs or files; trainers call these functions.
Advantage estimators and policy losses are looked up by name in registries (``register_advantage``,
``register_policy_loss``), so a user's own joins the built-in ones and is selected from a config.
"""

from comlrl.core.advantages import ADVANTAGE_MODES, group_advantages, normalize_flat, normalize_groups
from comlrl.core.credit import (
    SCALE_REWARDS,
    counterfactual_advantages,
    joint_returns_of_agent,
    mean_pairwise_correlation,
    pooled_advantages,
    scale_advantages,
    sequential_ratio,
    soft_overlong_penalty,
    zero_signal_fraction,
)
from comlrl.core.kl import k2_token_kl, k3_token_kl, sequence_kl, sequence_log_ratio, stale_token_weights
from comlrl.core.logprobs import sequence_logprobs
from comlrl.core.policy_loss import (
    NORMALISERS,
    PolicyLoss,
    PolicyLossInputs,
    PolicyLossOutput,
    Surrogate,
    aggregate,
    compute_policy_loss,
    policy_gradient_loss,
    register_policy_loss,
    sequence_surrogate,
    token_surrogate,
)
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
from comlrl.core.registry import (
    advantage_names,
    get_advantage,
    get_policy_loss,
    policy_loss_names,
    register_advantage,
)
from comlrl.core.value_loss import value_loss
from comlrl.core.returns import cross_marginal_returns, node_returns, rewards_to_go, td_targets

__all__ = [
    "ADVANTAGE_MODES",
    "NORMALISERS",
    "PolicyLoss",
    "PolicyLossInputs",
    "PolicyLossOutput",
    "SCALE_REWARDS",
    "Surrogate",
    "aggregate",
    "compute_policy_loss",
    "advantage_names",
    "bradley_terry_loss",
    "counterfactual_advantages",
    "cross_marginal_returns",
    "get_advantage",
    "get_policy_loss",
    "group_advantages",
    "joint_margin_loss",
    "joint_returns_of_agent",
    "k2_token_kl",
    "k3_token_kl",
    "mean_pairwise_correlation",
    "node_returns",
    "normalize_flat",
    "normalize_groups",
    "policy_gradient_loss",
    "policy_loss_names",
    "pooled_advantages",
    "preference_accuracy",
    "register_advantage",
    "register_policy_loss",
    "replay_allocation",
    "replay_sample_size",
    "replay_weights",
    "rewards_to_go",
    "scale_advantages",
    "select_candidate_pairs",
    "select_comparisons",
    "sequence_kl",
    "sequence_log_ratio",
    "sequence_logprobs",
    "sequence_surrogate",
    "sequential_ratio",
    "soft_overlong_penalty",
    "shard_draw",
    "stale_token_weights",
    "td_targets",
    "token_surrogate",
    "value_loss",
    "zero_signal_fraction",
]
