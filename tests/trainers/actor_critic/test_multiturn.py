"""Multi-turn actor-critic episodes: the external transition sees the right histories, targets
bootstrap from the next turn's value, and early termination ends an episode."""

import pytest
import torch
from tests.helpers.common import length_ratio, no_signal_expected
from torch.testing import assert_close

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

BASE = dict(num_generations=1, max_new_tokens=4, num_train_epochs=1, verbose=False, eval_interval=0)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        self.calls.append(dict(prompt=prompt, completions=list(agent_completions), num_agents=num_agents,
                               prompts=[list(h) for h in prompt_history_per_agent], responses=[list(h) for h in response_history_per_agent]))
        return [f"Turn {len(h) + 1} for agent {i}" for i, h in enumerate(response_history_per_agent)]


def collect(store):
    def callback(rollouts):
        store.append(list(rollouts))
        return {}

    return callback


def test_transition_receives_the_histories_and_targets_bootstrap(tiny_paths, prompts_dataset):
    transition, episodes = Recorder(), []
    trainer = MAACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
        external_transition=transition, metrics_callback=collect(episodes), train_dataset=prompts_dataset,
        args=MAACConfig(**BASE, num_turns=3, rollout_buffer_size=6, early_termination_threshold=None, discount=0.9),
        formatters=[lambda item: "Brief: " + item["prompt"], lambda item, external_prompts=None: "Long: " + (external_prompts or item["prompt"])],
    )
    trainer.train()
    assert trainer.env_step == 4 * 3 and len(transition.calls) == 4 * 2  # one joint response per turn
    samples = episodes[0]
    by_turn = {(s.agent_idx, s.turn_idx): s for s in samples}
    assert len(samples) == 2 * 3
    city = [c for c in transition.calls if c["prompt"] == "Describe a city"]  # items of a step share each turn's level
    first, second = sorted(city, key=lambda c: len(c["prompts"][0]))
    assert first["prompt"] == "Describe a city" and first["num_agents"] == 2
    assert first["completions"] == [by_turn[(0, 0)].completion, by_turn[(1, 0)].completion]
    assert first["prompts"] == [["Brief: Describe a city"], ["Long: Describe a city"]]
    assert first["responses"] == [[by_turn[(0, 0)].completion], [by_turn[(1, 0)].completion]]
    # turn 2 prompts come from the transition through each formatter (as external_prompts, or as the item's prompt)
    assert by_turn[(1, 1)].prompt == "Long: Turn 2 for agent 1" and by_turn[(0, 1)].prompt == "Brief: Turn 2 for agent 0"
    assert second["prompts"][1] == ["Long: Describe a city", "Long: Turn 2 for agent 1"]
    assert second["responses"][0] == [by_turn[(0, 0)].completion, by_turn[(0, 1)].completion]
    for agent in range(2):
        turns = [by_turn[(agent, t)] for t in range(3)]
        rewards = [float(s.reward) for s in turns]
        # y_t = r_t + 0.9 * V(h_{t+1}) with the next turn's rollout value; the last turn does not bootstrap
        assert_close(turns[0].value_target, torch.tensor(rewards[0] + 0.9 * float(turns[1].old_value)))
        assert_close(turns[1].value_target, torch.tensor(rewards[1] + 0.9 * float(turns[2].old_value)))
        assert_close(turns[2].value_target, torch.tensor(rewards[2]))
        assert_close(turns[0].advantage, turns[0].value_target - turns[0].old_value)
        assert_close(turns[0].returns, torch.tensor(rewards[0] + 0.9 * rewards[1] + 0.81 * rewards[2]))


# a constant reward: no step has a learning signal, and the trainer says so
@no_signal_expected
def test_early_termination_ends_the_episode(tiny_paths, prompts_dataset):
    transition, episodes = Recorder(), []
    trainer = IACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=lambda a, b: [1.0] * len(a),
        external_transition=transition, metrics_callback=collect(episodes), train_dataset=prompts_dataset,
        args=IACConfig(**BASE, num_turns=3, early_termination_threshold=0.5),  # every turn's mean reward 1 > 0.5
    )
    trainer.train()
    assert transition.calls == [] and trainer.env_step == 4
    assert all(s.turn_idx == 0 and float(s.value_target) == 1.0 for item in episodes for s in item)


def test_passthrough_prompts_and_shared_heads_over_turns(tiny_paths, prompts_dataset):
    transition, episodes = Recorder(), []
    trainer = IACTrainer(
        agent_model=tiny_paths["gpt2"], reward_func=length_ratio, external_transition=transition,
        metrics_callback=collect(episodes), train_dataset=prompts_dataset,
        args=IACConfig(**BASE, num_turns=2, use_separate_critic=False, external_prompt_passthrough=True,
                       early_termination_threshold=None, rollout_buffer_size=4),
    )
    before = [p.detach().clone() for p in trainer.agents[1].value_head.parameters()]
    trainer.train()
    assert {s.prompt for item in episodes for s in item if s.turn_idx == 1} == {"Turn 2 for agent 0", "Turn 2 for agent 1"}
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.agents[1].value_head.parameters()))
    assert {"turn_1/reward_mean", "turn_2/expected_return"} <= set().union(*trainer.log_history)


@pytest.mark.parametrize("trainer_cls, config_cls, extra", [
    (MAACTrainer, MAACConfig, {}),
    (IACTrainer, IACConfig, {"use_separate_critic": False}),
])
def test_several_generations_per_turn_grow_a_tree(tiny_paths, prompts_dataset, trainer_cls, config_cls, extra):
    """K = 2 over 2 turns: each root joint response branches into its own second turn (the MAAC
    paper's HouseBuild setup); targets bootstrap from the mean value of the child's K samples."""
    transition, episodes = Recorder(), []
    critic = {} if extra else {"critic_model": tiny_paths["llama"]}
    trainer = trainer_cls(
        agent_model=tiny_paths["llama"], reward_func=length_ratio, external_transition=transition,
        metrics_callback=collect(episodes), train_dataset=prompts_dataset,
        args=config_cls(**{**BASE, "num_generations": 2}, num_turns=2, rollout_buffer_size=6, early_termination_threshold=None,
                        discount=0.5, **extra),
        **critic,
    )
    trainer.train()
    per_item = 2 + 2 * 2  # joint responses: 2 at the root, 2 at each of its 2 children
    assert trainer.env_step == 4 * per_item and len(transition.calls) == 4 * 2
    for item in episodes:
        for agent in range(2):
            samples = [s for s in item if s.agent_idx == agent]
            assert [s.turn_idx for s in samples] == [0, 0, 1, 1, 1, 1]  # pre-order: root's K, child 0's K, child 1's K
            root, children = samples[:2], [samples[2:4], samples[4:6]]
            for j, child in enumerate(children):
                bootstrap = torch.stack([s.old_value for s in child]).mean()
                assert_close(root[j].value_target, torch.tensor(float(root[j].reward)) + 0.5 * bootstrap)
                assert all(float(s.value_target) == float(s.reward) for s in child)  # the horizon: no bootstrap
                # the child's history is root joint response j's: the transition saw that response
                assert child[0].prompt == f"Turn 2 for agent {agent}"
