"""IAC (separate critics and value heads on the actors) and MAAC learn in the direction of the
reward, with weight decay 0 so that nothing else moves a weight:

- a constant reward gives every completion of a prompt the same TD error, so after the per-group
  standardisation the actors' advantages are exactly zero and the actors stay bit-identical;
- a reward that prefers one completion raises its log-probability and lowers the other's;
- the critics' values move toward their TD targets (a constant reward r: toward r).

A Q critic's advantage (that it favours the better action) lands with issue 8; see docs/testing.md.
"""

import pytest
import torch
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

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

BASE = dict(num_turns=1, num_train_epochs=1, verbose=False, eval_interval=0, weight_decay=0.0, logging_steps=1,
            agent_learning_rate=1e-2, critic_learning_rate=1e-2)
ARRANGEMENTS = ["iac_separate", "iac_heads", "maac"]




def build(arrangement, agent, critic_path, reward, data, tokenizer=None, callback=None, **overrides):
    """One of the three critic arrangements, with ``agent`` (an id, or a model object and its tokenizer)."""
    agents = [agent] if tokenizer is not None else None
    actors = dict(agents=agents, tokenizer=tokenizer) if agents else dict(agent_model=agent)
    common = dict(reward_func=reward, train_dataset=data, metrics_callback=callback)
    if arrangement == "maac":
        return MAACTrainer(**actors, critic_model=critic_path, args=MAACConfig(**{**BASE, **overrides}), **common)
    if arrangement == "iac_heads":
        return IACTrainer(**actors, args=IACConfig(**{**BASE, **overrides}, use_separate_critic=False), **common)
    critics = dict(critics=[critic_path] * (1 if agents else overrides.get("num_agents", 2)))
    return IACTrainer(**actors, **critics, args=IACConfig(**{**BASE, **overrides}), **common)


def recorder(store):
    def callback(rollouts):
        store.extend(rollouts)
        return {}

    return callback


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
def test_constant_reward_leaves_the_actors_unchanged(tiny_paths, arrangement):
    # One prompt per update (rollout_buffer_size = K = 3): all its samples share V(prompt), so their
    # TD errors r - V are equal and standardise to exactly 0. (Over several prompts the TD errors
    # differ and a constant reward still moves the actors, in expectation by nothing.) Shared value
    # heads train the backbone with the value loss; value_loss_coef=0 isolates the policy gradient.
    overrides = dict(value_loss_coef=0.0) if arrangement == "iac_heads" else {}
    trainer = build(arrangement, tiny_paths["llama"], tiny_paths["llama"], lambda c1, c2: [2.9] * len(c1), dataset(2),
                    num_generations=3, rollout_buffer_size=3, max_new_tokens=3, **overrides)
    actors = [snapshot(agent) for agent in trainer.agents]
    critics = [snapshot(critic) for critic in trainer.critics]
    trainer.train()
    for index, (agent, optimizer) in enumerate(zip(trainer.agents, trainer.agent_optimizers)):
        assert set(adam_steps(optimizer)) == {2}, "one AdamW step per drain for every parameter"
        assert_unchanged(agent, actors[index], f"{arrangement} agent {index}")
    for critic, before in zip(trainer.critics, critics):  # the critics did learn: toward 2.9
        assert any(not torch.equal(a, b) for a, b in zip(before, critic.parameters()))


# the two-token policy's group of a step may hold one completion only (on some seeds): the trainer says so
@no_signal_expected
@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
def test_a_preferred_completion_gains_probability(tiny_paths, arrangement):
    model, tokenizer, ids = two_token_policy(tiny_paths["llama"])
    prompts = PROMPTS[:4]
    before = completion_logprobs(model, tokenizer, prompts, ids)
    trainer = build(arrangement, model, tiny_paths["llama"], preference_reward, dataset(4), tokenizer=tokenizer,
                    num_agents=1, num_generations=4, rollout_buffer_size=4, **{**ONE_TOKEN, "agent_learning_rate": 5e-3})
    assert trainer.agents[0].model is model
    trainer.train()
    assert_preference_learned(before, completion_logprobs(model, tokenizer, prompts, ids))


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo", "gspo"])
@pytest.mark.parametrize("arrangement", ["iac_separate", "maac"])
def test_every_policy_loss_raises_the_preferred_completion(tiny_paths, arrangement, loss_type):
    """The actors take the registry's losses through the one update path; two passes over each buffer,
    so the second is importance-weighted and clipped (GSPO: at its own 3e-4 / 4e-4)."""
    model, tokenizer, ids = two_token_policy(tiny_paths["llama"])
    prompts = PROMPTS[:4]
    before = completion_logprobs(model, tokenizer, prompts, ids)
    trainer = build(arrangement, model, tiny_paths["llama"], preference_reward, dataset(4), tokenizer=tokenizer, num_agents=1,
                    num_generations=4, rollout_buffer_size=4, update_epochs=2, loss_type=loss_type,
                    **{**ONE_TOKEN, "agent_learning_rate": 5e-3})
    assert trainer.step.update_settings.loss.name == loss_type
    trainer.train()
    assert_preference_learned(before, completion_logprobs(model, tokenizer, prompts, ids))


def values_of(model, samples):
    """The value of each sample's critic input (prompt for V, prompt + completion for Q) now."""
    with torch.no_grad():
        return torch.stack([model(input_ids=s.critic_input_ids.unsqueeze(0)).values[0, -1].float() for s in samples])


def critic_of(trainer, arrangement, agent):
    """The model holding agent ``agent``'s value head: its own critic, the central one, or itself."""
    if arrangement == "iac_heads":
        return trainer.agents[agent]
    return trainer.critics[0 if arrangement == "maac" else agent]


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
@pytest.mark.parametrize("arrangement, critic_type", [("iac_separate", "v"), ("iac_heads", "v"), ("iac_heads", "q"), ("maac", "v")])
def test_values_move_toward_their_td_targets(tiny_paths, arrangement, critic_type):
    samples, reward = [], 1.5
    trainer = build(arrangement, tiny_paths["llama"], tiny_paths["llama"], lambda c1, c2: [reward] * len(c1), dataset(2),
                    callback=recorder(samples), num_generations=2, rollout_buffer_size=4, max_new_tokens=3, critic_type=critic_type)
    trainer.train()
    assert len(samples) == 2 * 2 * 2  # 2 items x 2 generations x 2 agents
    for agent in range(2):
        mine = [s for s in samples if s.agent_idx == agent]
        targets = torch.stack([s.value_target for s in mine])
        assert torch.equal(targets, torch.full_like(targets, reward))  # one turn: y = r, no bootstrap
        old = torch.stack([s.old_value.float() for s in mine])
        new = values_of(critic_of(trainer, arrangement, agent), mine)
        # one shared function approximator and AdamW's first steps: the squared error falls over the
        # samples (not necessarily at each one), and the mean value rises toward the target
        before, after = ((old - targets) ** 2).mean(), ((new - targets) ** 2).mean()
        assert after < 0.9 * before and (targets - new).mean() < (targets - old).mean(), (old.tolist(), new.tolist())
