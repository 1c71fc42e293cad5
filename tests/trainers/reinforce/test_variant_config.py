"""The variant fields of MAGRPOConfig: validated against the registries (a user's own estimator or
loss is selected by name and really used), and the refused combinations name the fields and the fix."""

import re

import pytest
import torch
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.common import snapshot
from tests.helpers.tolerances import rounding_bound

from comlrl.core import register_advantage, register_policy_loss, token_surrogate
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import REPO_ROOT

CALLS = {"loss": 0, "advantage": 0}


@register_policy_loss("test_counted_sum", normaliser="none", replace=True)
def _counted_sum(inputs):
    CALLS["loss"] += 1
    return token_surrogate(inputs)


@register_advantage("test_counted_mean", replace=True)
def _counted_mean(returns):
    CALLS["advantage"] += 1
    return returns - returns.mean(dim=-1, keepdim=True)


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ValueError, match="advantage_mode must be one of mean, max, rloo, raw.*Got 'median'"):
        MAGRPOConfig(advantage_mode="median")
    with pytest.raises(ValueError, match="loss_type must be one of sequence_sum, grpo, dr_grpo, dapo, bnpo, gspo"):
        MAGRPOConfig(loss_type="ppo")


def test_user_registered_loss_and_estimator_train_from_a_config(tiny_paths):
    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, verbose=False, num_agents=1, num_generations=3, max_new_tokens=4,
                          rollout_buffer_size=2, agent_learning_rate=1e-2, loss_type="test_counted_sum",
                          advantage_mode="test_counted_mean")
    assert (config.loss_type, config.advantage_mode) == ("test_counted_sum", "test_counted_mean")
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"]], num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
                            train_dataset=dataset(4), args=config)
    before = snapshot(trainer.agents[0])
    CALLS.update(loss=0, advantage=0)
    trainer.train()
    assert CALLS["loss"] == 2  # 4 prompts / 2 per buffer: two optimizer steps, one micro-batch each
    assert CALLS["advantage"] >= 4  # one call per group (and the logged credit correlation)
    assert any((a != b).any() for a, b in zip(before, trainer.agents[0].parameters()))


@pytest.mark.parametrize("fields, message", [
    (dict(loss_type="dapo", epsilon_high=0.28, importance_clip_range=None), "epsilon_high needs importance_clip_range"),
    (dict(loss_type="dapo", epsilon_high=-1.0), "epsilon_high must be"),
    (dict(scale_rewards="batch", advantage_normalization=False), "scale_rewards='batch' needs advantage_normalization=True"),
    (dict(scale_rewards="std"), "scale_rewards must be one of group, batch, agent, none"),
    (dict(soft_overlong_cache=256), "soft_overlong_cache must be None or an integer in [1, max_new_tokens - 1] = [1, 255]"),
    (dict(soft_overlong_cache=0), "soft_overlong_cache must be None"),
    (dict(dynamic_sampling=True, advantage_grouping="agent_turn"), 'use advantage_grouping="node" or dynamic_sampling=False'),
    (dict(dynamic_sampling=True, sequential_updates=True), "dynamic_sampling can keep one agent's group"),
    (dict(overlong_filtering=1), "overlong_filtering must be True or False"),
    (dict(advantage_grouping="item"), "advantage_grouping must be one of node, agent_turn"),
    (dict(counterfactual_credit=True), 'counterfactual_credit needs joint_mode="cross"'),
    (dict(counterfactual_credit=True, joint_mode="cross", advantage_grouping="agent_turn"), 'use advantage_grouping="node"'),
    (dict(counterfactual_credit="yes"), "counterfactual_credit must be True or False"),
    (dict(sequential_updates=True, joint_mode="cross"), 'sequential_updates needs joint_mode="aligned"'),
    (dict(sequential_updates=True, parallel_training="mp", agent_devices=["cpu", "cpu"]), 'parallel_training="mp"'),
])
def test_refused_combinations(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MAGRPOConfig(num_agents=2, **fields)


def test_accepted_variant_values_are_normalised():
    config = MAGRPOConfig(loss_type=" DAPO ", epsilon_high=0.28, scale_rewards="Batch", advantage_grouping="agent_turn")
    assert (config.loss_type, config.scale_rewards, config.advantage_grouping) == ("dapo", "batch", "agent_turn")


def test_the_documented_registration_example_runs(monkeypatch):
    import os
    import re

    import torch

    from comlrl.core.registry import ADVANTAGES, POLICY_LOSSES

    monkeypatch.setattr(ADVANTAGES, "_table", dict(ADVANTAGES._table))  # the example's names stay in this test
    monkeypatch.setattr(POLICY_LOSSES, "_table", dict(POLICY_LOSSES._table))
    with open(os.path.join(REPO_ROOT, "docs", "algorithms.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 1
    namespace: dict = {}
    exec(compile(blocks[0], "docs/algorithms.md", "exec"), namespace)
    assert (namespace["config"].advantage_mode, namespace["config"].loss_type) == ("median", "half_sum")
    # [1, 5, 3]: median 3 -> [-2, 2, 0]
    assert torch.equal(namespace["median_baseline"](torch.tensor([1.0, 5.0, 3.0])), torch.tensor([-2.0, 2.0, 0.0]))


def test_multi_agent_diagnostics_are_logged(tiny_paths):
    from tests.helpers.direction import record_calls

    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, verbose=False, num_generations=3, max_new_tokens=4,
                          rollout_buffer_size=2, logging_steps=1)
    # shared reward, aligned mode: both agents get the same returns, hence the same advantages
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)],
                            train_dataset=dataset(4), args=config)
    calls = record_calls(trainer)
    trainer.train()
    correlations = [c["agents/credit_correlation"] for c in calls if "agents/credit_correlation" in c]
    # identical float32 credits: their correlation is 1 up to the float64 rounding of its centring, dot
    # product and norms over the J <= 64 joint responses of a step
    assert correlations and all(abs(c - 1.0) <= rounding_bound(4 * 64, 1.0, torch.float64) for c in correlations)
    steps = [c for c in calls if "agent_1/grad_norm" in c]
    assert len(steps) == 2
    for row in steps:
        assert row["agent_1/advantage_abs_mean"] >= 0.0 and row["agent_1/grad_norm"] >= 0.0
        assert 0.0 <= row["agent_1/frac_zero_signal_groups"] <= 1.0


def test_marlhf_rl_phase_takes_the_variants_and_actor_critic_refuses_them():
    from comlrl.trainers.preference import MARLHFConfig

    config = MARLHFConfig(loss_type="dapo", epsilon_high=0.28, scale_rewards="batch", dynamic_sampling=True)
    assert (config.loss_type, config.epsilon_high, config.scale_rewards, config.dynamic_sampling) == ("dapo", 0.28, "batch", True)
    with pytest.raises(ValueError, match="scale_rewards, sequential_updates: the MAGRPO-family learning variants need"):
        MARLHFConfig(rl_algorithm="maac", scale_rewards="none", sequential_updates=True)
    with pytest.raises(ValueError, match="dynamic_sampling, soft_overlong_cache: the MAGRPO-family learning variants need"):
        MARLHFConfig(rl_algorithm="iac", dynamic_sampling=True, soft_overlong_cache=8)
    # the policy loss is every backend's: an actor-critic backend takes it
    assert MARLHFConfig(rl_algorithm="iac", loss_type="grpo", epsilon_high=0.28).loss_type == "grpo"
    with pytest.raises(ValueError, match='counterfactual_credit needs joint_mode="cross"'):
        MARLHFConfig(counterfactual_credit=True)


@pytest.mark.parametrize("config_cls", ["magrpo", "iac", "maac", "marlhf"])
def test_gspo_defaults_to_its_published_clip_range_and_records_it(config_cls):
    from comlrl.trainers.actor_critic import IACConfig, MAACConfig
    from comlrl.trainers.preference import MARLHFConfig

    cls = {"magrpo": MAGRPOConfig, "iac": IACConfig, "maac": MAACConfig, "marlhf": MARLHFConfig}[config_cls]
    config = cls(loss_type="gspo")
    # GSPO (Zheng et al. 2025, section 5.1): left 3e-4, right 4e-4, in the config as resolved
    assert (config.importance_clip_range, config.epsilon_high) == (3e-4, 4e-4)
    assert (config.to_dict()["importance_clip_range"], config.to_dict()["epsilon_high"]) == (3e-4, 4e-4)
    # a value the user set wins; an unset upper bound follows GSPO only with the lower one unset
    assert (cls(loss_type="gspo", epsilon_high=1e-3).importance_clip_range, cls(loss_type="gspo", epsilon_high=1e-3).epsilon_high) == (3e-4, 1e-3)
    mine = cls(loss_type="gspo", importance_clip_range=0.01)
    assert (mine.importance_clip_range, mine.epsilon_high) == (0.01, None)
    assert cls(loss_type="gspo", importance_clip_range=None).importance_clip_range is None
    assert (cls(loss_type="grpo").importance_clip_range, cls(loss_type="grpo").epsilon_high) == (0.2, None)


def test_scale_rewards_batch_divides_by_the_std_of_the_raw_rewards_of_the_buffer(tiny_paths):
    """Two prompts whose rewards lie 10 apart (the j-th completion scores j, or 10 + j): with the mean
    baseline the advantages are [-0.5, 0.5] in both groups, and TRL's batch scale divides them by the
    population std of [0, 1, 10, 11], sqrt(25.25) = 5.02494: advantage_std 0.0995, where "agent" (the
    former "batch") standardises the buffer to exactly 1."""
    def reward(completions, batch_items=None):
        base = 10.0 if batch_items[0]["prompt"] == dataset(2)["prompt"][1] else 0.0
        return [base + j for j in range(len(completions))]

    for scale, expected in (("batch", 0.5 / 25.25**0.5), ("agent", 1.0)):
        config = MAGRPOConfig(num_turns=1, num_train_epochs=1, verbose=False, num_agents=1, num_generations=2, max_new_tokens=3,
                              rollout_buffer_size=2, logging_steps=1, scale_rewards=scale)
        trainer = MAGRPOTrainer(agents=[tiny_paths["llama"]], num_agents=1, reward_func=reward, train_dataset=dataset(2), args=config)
        seen = []
        original = trainer.step.policy_step
        trainer.step.policy_step = lambda agent, batch: seen.extend(batch) or original(agent, batch)
        trainer.train()
        assert len(seen) == 2
        for _, advantages in seen:
            assert advantages.tolist() == pytest.approx([-expected, expected], rel=1e-6)
        assert trainer.log_history[-1]["agent_0/advantage_std"] == pytest.approx(expected, rel=1e-6)


def test_cross_mode_logs_no_credit_correlation(tiny_paths):
    """In cross mode agent i's advantage varies along axis i of each node's K^N grid, so any two agents'
    credits are uncorrelated by construction: the metric would say nothing and is not logged."""
    from tests.helpers.direction import record_calls

    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, verbose=False, num_generations=2, max_new_tokens=3, rollout_buffer_size=2,
                          logging_steps=1, joint_mode="cross")
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=lambda a, b: [float(len(x) - len(y)) for x, y in zip(a, b)],
                            train_dataset=dataset(2), args=config)
    calls = record_calls(trainer)
    trainer.train()
    assert any("agent_1/advantage_abs_mean" in c for c in calls)
    assert not any("agents/credit_correlation" in c for c in calls)


def test_actor_critic_actors_take_a_registered_loss(tiny_paths):
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer

    config = IACConfig(num_turns=1, num_train_epochs=1, verbose=False, eval_interval=0, num_generations=2, max_new_tokens=3,
                       rollout_buffer_size=4, loss_type="test_counted_sum", use_separate_critic=False, num_agents=1)
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=lambda c: [float(len(x)) for x in c],
                         train_dataset=dataset(2), args=config)
    CALLS.update(loss=0)
    trainer.train()
    assert trainer.step.update_settings.loss.name == "test_counted_sum"
    assert CALLS["loss"] == 1  # 2 items x K = 2: one buffer of 4 samples, one actor step
