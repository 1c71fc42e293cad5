"""DAPO's three fields beyond its token-mean loss (``dynamic_sampling``, ``overlong_filtering``,
``soft_overlong_cache``), each checked against numbers worked by hand and for its direction on a tiny
model (weight decay 0); the direction of dynamic sampling with DAPO's loss is in
test_direction_variants.py."""

import pytest
import torch
from tests.helpers.common import PROMPTS, snapshot, no_signal_expected
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import (
    ONE_TOKEN,
    assert_unchanged,
    completion_logprobs,
    negated_mean_baseline,
    record_calls,
    two_token_policy,
)
from transformers import AutoTokenizer

from comlrl.rollout.tree import GroupSample
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.trainers.reinforce.group_credit import GroupCredit

BASE = dict(num_turns=1, num_train_epochs=1, verbose=False, logging_steps=1, weight_decay=0.0)
TIED = {PROMPTS[0], PROMPTS[2]}


def tie_on_even_prompts(completions, batch_items=None):
    """Prompts 0 and 2: every completion scores 0 (a group without signal); prompts 1 and 3: the
    j-th completion scores j (never a tie)."""
    if batch_items[0]["prompt"] in TIED:
        return [0.0] * len(completions)
    return [float(j) for j in range(len(completions))]


def test_dynamic_sampling_keeps_only_groups_with_signal(tiny_paths, monkeypatch):
    # 4 prompts, 2 items per step, buffers of 2 groups: step 1 (prompts 0, 1) keeps prompt 1's group,
    # the buffer is not full; step 2 (prompts 2, 3) keeps prompt 3's and the buffer drains once, with
    # the two groups of returns [0, 1, 2, 3]. Without dynamic sampling each step drains its two
    # groups, one of them tied.
    import comlrl.trainers.update as update

    def run(dynamic):
        config = MAGRPOConfig(**BASE, num_agents=1, num_generations=4, max_new_tokens=4, rollout_buffer_size=2, loss_type="dapo",
                              dynamic_sampling=dynamic)
        trainer = MAGRPOTrainer(agents=[tiny_paths["llama"]], num_agents=1, reward_func=tie_on_even_prompts, train_dataset=dataset(4),
                                args=config)
        updates, normalisers = [], []
        original_step, original_tokens = trainer.step.policy_step, update.step_tokens
        trainer.step.policy_step = lambda agent, minibatch: updates.append([s for s, _ in minibatch]) or original_step(agent, minibatch)
        monkeypatch.setattr(update, "step_tokens", lambda rows, ranks=None: normalisers.append(original_tokens(rows, ranks)) or normalisers[-1])
        calls = record_calls(trainer)
        trainer.train()
        return updates, normalisers, calls

    updates, normalisers, calls = run(True)
    assert len(updates) == 1 and [s.returns.tolist() for s in updates[0]] == [[0.0, 1.0, 2.0, 3.0]] * 2
    # DAPO's T_B: the mean real tokens per completion over the kept groups only (the tied ones' tokens are gone)
    assert normalisers == [pytest.approx(sum(len(c) for s in updates[0] for c in s.completion_ids) / 8)]
    assert [c["dynamic_sampling/dropped_fraction"] for c in calls if "dynamic_sampling/dropped_fraction" in c] == [0.5, 0.5]
    assert [c["agent_0/frac_zero_signal_groups"] for c in calls if "agent_0/frac_zero_signal_groups" in c] == [0.0]

    updates, normalisers, calls = run(False)
    assert len(updates) == 2 and not any("dynamic_sampling/dropped_fraction" in c for c in calls)
    assert [c["agent_0/frac_zero_signal_groups"] for c in calls if "agent_0/frac_zero_signal_groups" in c] == [0.5, 0.5]
    # each step's T_B counts its tied group's tokens too
    for groups, tokens in zip(updates, normalisers):
        assert tokens == pytest.approx(sum(len(c) for s in groups for c in s.completion_ids) / 8)


def test_dynamic_sampling_is_refused_under_torchrun(tiny_paths, monkeypatch):
    from comlrl.parallel.data_parallel import DataParallel

    monkeypatch.setattr(DataParallel, "current", classmethod(lambda cls: cls(rank=0, world_size=2)))
    with pytest.raises(ValueError, match="dynamic_sampling=True drops each rank's tied groups"):
        MAGRPOTrainer(agents=[tiny_paths["llama"]], num_agents=1, reward_func=tie_on_even_prompts, train_dataset=dataset(4),
                      args=MAGRPOConfig(**BASE, num_agents=1, dynamic_sampling=True))


def test_overlong_filtering_leaves_a_policy_of_truncated_completions_unchanged(tiny_paths):
    """With max_new_tokens=1 and only "a" / "b" possible, every completion reaches the limit without an
    EOS: filtered, none teaches anything although the reward prefers "b" (without the filter it is
    learned: test_direction_variants.py)."""
    model, tokenizer, ids = two_token_policy(tiny_paths["llama"])
    before = snapshot(model)
    trainer = MAGRPOTrainer(agents=[model], tokenizer=tokenizer, num_agents=1, train_dataset=dataset(4),
                            reward_func=lambda c: [float(x == "b") for x in c],
                            args=MAGRPOConfig(**{**BASE, **ONE_TOKEN}, num_agents=1, num_generations=4, rollout_buffer_size=2,
                                              agent_learning_rate=5e-3, overlong_filtering=True))
    calls = record_calls(trainer)
    trainer.train()
    assert_unchanged(model, before, "agent 0 with every completion filtered")
    fractions = [c["agent_0/overlong_filtered_fraction"] for c in calls if "agent_0/overlong_filtered_fraction" in c]
    assert fractions == [1.0, 1.0]
    assert all(c["agent_0/frac_zero_signal_groups"] < 1.0 for c in calls if "agent_0/frac_zero_signal_groups" in c)


@pytest.mark.parametrize("flip", [False, True], ids=["rewarded", "flipped"])
def test_overlong_filtering_learns_from_the_finished_completions(tiny_paths, flip):
    """A policy over "b" and EOS with max_new_tokens=1: "b" is truncated (masked out), "<eos>" finished.
    The reward prefers "<eos>" (1 against 0), so the finished rows alone raise P(EOS); with the
    advantages' sign flipped they lower it. The truncated rows' rewards still set the baseline."""
    eos = AutoTokenizer.from_pretrained(tiny_paths["llama"]).eos_token
    model, tokenizer, ids = two_token_policy(tiny_paths["llama"], tokens=("b", eos))
    prompts = PROMPTS[:4]
    before = completion_logprobs(model, tokenizer, prompts, ids)
    config = MAGRPOConfig(**{**BASE, **ONE_TOKEN}, num_agents=1, num_generations=4, rollout_buffer_size=2, agent_learning_rate=5e-3,
                          overlong_filtering=True, advantage_mode=negated_mean_baseline() if flip else "mean")
    trainer = MAGRPOTrainer(agents=[model], tokenizer=tokenizer, num_agents=1, train_dataset=dataset(4),
                            reward_func=lambda c: [float(x == "") for x in c], args=config)  # "<eos>" decodes to ""
    calls = record_calls(trainer)
    trainer.train()
    rise = completion_logprobs(model, tokenizer, prompts, ids)[eos] - before[eos]
    assert torch.all(rise < -1e-3 if flip else rise > 1e-3), rise.tolist()
    fractions = [c["agent_0/overlong_filtered_fraction"] for c in calls if "agent_0/overlong_filtered_fraction" in c]
    assert fractions and all(0.0 < f < 1.0 for f in fractions)  # both kinds were sampled


def group(completions, returns):
    return GroupSample(agent_idx=0, turn_idx=0, prompt_ids=torch.tensor([1]), completion_ids=[torch.tensor(c) for c in completions],
                       returns=torch.tensor(returns), node_env_step=0, node_mean_reward=0.0, node_mean_return=0.0)


def test_soft_overlong_punishment_is_added_to_each_completions_credit():
    # L_max = 8, L_cache = 4: lengths 3, 4, 5, 8 -> 0, 0, (4 - 5) / 4 = -0.25, (4 - 8) / 4 = -1
    config = MAGRPOConfig(num_turns=1, max_new_tokens=8, soft_overlong_cache=4, advantage_normalization=False)
    credit = GroupCredit.from_config(config)
    sample = group([[5] * 3, [5] * 4, [5] * 5, [5] * 8], [1.0, 1.0, 1.0, 1.0])
    torch.testing.assert_close(credit.returns(sample), torch.tensor([1.0, 1.0, 0.75, 0.0]))
    # mean baseline of [1, 1, 0.75, 0]: mean 0.6875 -> [0.3125, 0.3125, 0.0625, -0.6875]
    torch.testing.assert_close(credit.advantages([sample])[0], torch.tensor([0.3125, 0.3125, 0.0625, -0.6875]))
    assert credit.carries_signal(sample)  # the task reward ties, the shaped one does not
    assert not GroupCredit.from_config(MAGRPOConfig(num_turns=1, max_new_tokens=8)).carries_signal(sample)


@no_signal_expected  # tiny or scripted models: a step's answers may all score alike
@pytest.mark.parametrize("flip", [False, True], ids=["punished", "flipped"])
def test_soft_overlong_punishment_shortens_completions(tiny_paths, flip):
    """A policy over "b" and EOS, max_new_tokens=2 and L_cache=1: "<eos>" (1 token) takes no penalty,
    "b<eos>" and "bb" (2 tokens) take -1. The task reward is constant, so only the punishment moves the
    policy: P(EOS first) rises; with the advantages' sign flipped it falls."""
    eos = AutoTokenizer.from_pretrained(tiny_paths["llama"]).eos_token
    model, tokenizer, ids = two_token_policy(tiny_paths["llama"], tokens=("b", eos))
    prompts = PROMPTS[:4]
    before = completion_logprobs(model, tokenizer, prompts, ids)
    config = MAGRPOConfig(**{**BASE, **ONE_TOKEN, "max_new_tokens": 2}, num_agents=1, num_generations=4, rollout_buffer_size=2,
                          agent_learning_rate=5e-3, soft_overlong_cache=1, advantage_mode=negated_mean_baseline() if flip else "mean")
    trainer = MAGRPOTrainer(agents=[model], tokenizer=tokenizer, num_agents=1, train_dataset=dataset(4),
                            reward_func=lambda c: [0.0] * len(c), args=config)
    trainer.train()
    after = completion_logprobs(model, tokenizer, prompts, ids)
    rise = after[eos] - before[eos]
    assert torch.all(rise < -1e-3 if flip else rise > 1e-3), rise.tolist()
