"""Every learning variant (docs/algorithms.md) learns in the direction of the reward on a tiny model
(weight decay 0), and the same run with the advantages' sign flipped learns the opposite way: the
direction assertion would fail if a variant flipped the sign.

Two agents, each a two-token policy ("a" or "b", one token); the shared reward counts the agents that
said "b", so each agent's preferred completion is "b" whatever the other does.
"""

import pytest
from tests.helpers.common import PROMPTS, no_signal_expected
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import (
    ONE_TOKEN,
    PREFERRED,
    assert_preference_learned,
    completion_logprobs,
    negated_mean_baseline,
    record_calls,
    two_token_policy,
)

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

NEGATED_MEAN = negated_mean_baseline()


def shared_reward(c1, c2):
    return [float(a == PREFERRED) + float(b == PREFERRED) for a, b in zip(c1, c2)]


BASE = dict(num_turns=1, num_train_epochs=1, verbose=False, logging_steps=1, num_generations=4, **ONE_TOKEN, agent_learning_rate=5e-3)
# train_batch_size=1 with rollout_buffer_size=2: the second group of each buffer is stale, so the
# losses' importance ratio and clipping take part too.
STALE = dict(rollout_buffer_size=2, train_batch_size=1)
VARIANTS = {
    "grpo": dict(loss_type="grpo", **STALE),
    "dr_grpo": dict(loss_type="dr_grpo", **STALE),
    "dapo": dict(loss_type="dapo", epsilon_high=0.28, **STALE),
    "bnpo": dict(loss_type="bnpo", **STALE),
    # GSPO's own clip range (3e-4 / 4e-4) clips nearly every stale sequence after one step of this size,
    # so its default is tested on fresh groups and its stale path with a clip that leaves a gradient
    "gspo": dict(loss_type="gspo", rollout_buffer_size=2),
    "gspo_stale": dict(loss_type="gspo", importance_clip_range=0.2, epsilon_high=0.2, **STALE),
    # DAPO complete but the overlong parts (every one-token completion here is truncated: test_dapo.py)
    "dapo_dynamic_sampling": dict(loss_type="dapo", epsilon_high=0.28, dynamic_sampling=True, **STALE),
    "scale_batch": dict(scale_rewards="batch", rollout_buffer_size=2),
    "scale_agent": dict(scale_rewards="agent", rollout_buffer_size=2),
    "scale_none": dict(scale_rewards="none", rollout_buffer_size=2),
    # pooled over two prompts, the baseline mixes them: three epochs for every prompt to move up
    "agent_turn": dict(advantage_grouping="agent_turn", rollout_buffer_size=2, num_train_epochs=3),
    "counterfactual": dict(joint_mode="cross", counterfactual_credit=True, rollout_buffer_size=2),
    "sequential": dict(sequential_updates=True, rollout_buffer_size=2),
}


def _train(tiny_paths, fields):
    agents, tokenizers, ids = [], [], None
    for _ in range(2):
        model, tokenizer, ids = two_token_policy(tiny_paths["llama"])
        agents.append(model)
        tokenizers.append(tokenizer)
    prompts = PROMPTS[:4]
    before = [completion_logprobs(m, t, prompts, ids) for m, t in zip(agents, tokenizers)]
    trainer = MAGRPOTrainer(agents=agents, tokenizer=tokenizers, reward_func=shared_reward, train_dataset=dataset(4),
                            args=MAGRPOConfig(**{**BASE, **fields}))
    calls = record_calls(trainer)
    trainer.train()
    after = [completion_logprobs(m, t, prompts, ids) for m, t in zip(agents, tokenizers)]
    return before, after, calls


# the two-token policy's group of a step may hold one completion only (on some seeds): the trainer says so
@no_signal_expected
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_raises_the_rewarded_completion(tiny_paths, name):
    before, after, calls = _train(tiny_paths, VARIANTS[name])
    for b, a in zip(before, after):
        assert_preference_learned(b, a)
    correlations = [c["agents/credit_correlation"] for c in calls if "agents/credit_correlation" in c]
    if name == "counterfactual":  # cross mode: agent i's credit varies along axis i of the K x K grid, so no correlation is logged
        assert not correlations
    else:  # aligned mode, shared reward: every agent credited identically
        assert correlations and all(abs(c - 1.0) < 1e-6 for c in correlations)
    assert all(0.0 <= c["agent_0/frac_zero_signal_groups"] <= 1.0 for c in calls if "agent_0/frac_zero_signal_groups" in c)
    if name == "sequential":  # agent 1's advantages carried agent 0's ratio, which moved off 1
        factors = [c["agent_1/sequential_factor_mean"] for c in calls if "agent_1/sequential_factor_mean" in c]
        assert factors and any(abs(f - 1.0) > 1e-4 for f in factors)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_with_flipped_advantages_learns_the_other_way(tiny_paths, name):
    before, after, _ = _train(tiny_paths, {**VARIANTS[name], "advantage_mode": NEGATED_MEAN})
    flipped = {PREFERRED: "a", "a": PREFERRED}
    for b, a in zip(before, after):
        assert_preference_learned({flipped[k]: v for k, v in b.items()}, {flipped[k]: v for k, v in a.items()})
