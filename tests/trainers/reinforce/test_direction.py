"""The MAGRPO family learns in the direction of the reward (weight decay 0, so nothing else moves
the weights): a constant reward leaves every agent exactly as it was, and a reward that prefers
one completion raises that completion's log-probability and lowers the other's, for every baseline."""

import pytest
from tests.helpers.common import PROMPTS, no_signal_expected, snapshot
from tests.helpers.common import prompt_dataset as dataset
from tests.helpers.direction import (
    ONE_TOKEN,
    adam_steps,
    assert_preference_learned,
    assert_unchanged,
    completion_logprobs,
    preference_reward,
    two_token_policy,
)

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer

BASE = dict(num_turns=1, num_train_epochs=1, verbose=False, agent_learning_rate=1e-2, weight_decay=0.0, logging_steps=1)
FAMILY = {"mean": MAGRPOTrainer, "raw": MAREINFORCETrainer, "rloo": MARLOOTrainer, "max": MAReMaxTrainer}
# (baseline, advantage_normalization): REINFORCE without a baseline follows a constant reward by
# design (A = R), so it is checked only with the group standardisation that removes it.
CONSTANT_CASES = [("mean", False), ("mean", True), ("rloo", False), ("rloo", True), ("max", False), ("max", True), ("raw", True)]




# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("mode, normalize", CONSTANT_CASES)
def test_constant_reward_leaves_every_agent_unchanged(tiny_paths, mode, normalize):
    # K = 3 and a reward of 2.9: in float32, 2.9 - mean(2.9, 2.9, 2.9) = 2.4e-7 (and 0.24 once
    # standardised), rounding noise that AdamW would scale up to a full step.
    trainer = FAMILY[mode](
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=lambda c1, c2: [2.9] * len(c1),
        args=MAGRPOConfig(**BASE, num_generations=3, max_new_tokens=4, rollout_buffer_size=2, advantage_normalization=normalize),
        train_dataset=dataset(),
    )
    assert trainer.args.advantage_mode == mode
    before = [snapshot(agent) for agent in trainer.agents]
    trainer.train()
    for index, (agent, optimizer) in enumerate(zip(trainer.agents, trainer.optimizers)):
        assert set(adam_steps(optimizer)) == {2}, "every parameter took its two AdamW steps"
        assert_unchanged(agent, before[index], f"agent {index} ({mode}, normalize={normalize})")
    assert all(row["agent_0/advantage_std"] == 0.0 for row in trainer.log_history)


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("schedule", [dict(optimizer_in_backward=False), dict(max_grad_norm=1.0)])
def test_constant_reward_unchanged_with_the_after_backward_schedules(tiny_paths, schedule):
    trainer = MAGRPOTrainer(
        agents=[tiny_paths["gpt2"]], num_agents=1, reward_func=lambda c: [2.9] * len(c), train_dataset=dataset(2),
        args=MAGRPOConfig(**BASE, num_agents=1, num_generations=6, max_new_tokens=3, rollout_buffer_size=1,
                          advantage_normalization=False, **schedule),
    )
    before = snapshot(trainer.agents[0])
    trainer.train()
    assert set(adam_steps(trainer.optimizers[0])) == {2}
    assert_unchanged(trainer.agents[0], before, str(schedule))


# the two-token policy's group of a step may hold one completion only (on some seeds): the trainer says so
@no_signal_expected
@pytest.mark.parametrize("mode, normalize", [("mean", True), ("mean", False), ("raw", False), ("rloo", False), ("max", False)])
def test_a_preferred_completion_gains_probability(tiny_paths, mode, normalize):
    model, tokenizer, ids = two_token_policy(tiny_paths["llama"])
    prompts = PROMPTS[:4]
    before = completion_logprobs(model, tokenizer, prompts, ids)
    trainer = FAMILY[mode](
        agents=[model], tokenizer=tokenizer, num_agents=1, reward_func=preference_reward, train_dataset=dataset(4),
        args=MAGRPOConfig(**{**BASE, **ONE_TOKEN, "agent_learning_rate": 5e-3}, num_agents=1, num_generations=4, rollout_buffer_size=2,
                          advantage_normalization=normalize),
    )
    trainer.train()
    assert_preference_learned(before, completion_logprobs(model, tokenizer, prompts, ids))
