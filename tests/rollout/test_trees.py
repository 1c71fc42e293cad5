"""Rollout trees: returns with discount, cross credit, early termination, transitions and histories."""

import pytest
import torch
from tests.helpers.common import PROMPTS, changed, no_signal_expected, snapshot
from torch.testing import assert_close

from comlrl.rollout.formatters import build_formatters
from comlrl.rollout.generation import Completions, SamplingParams
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.tree import TreeRollout
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


class ScriptedGenerator:
    """Sample j of a prompt at turn t is the text "t<t>s<j>" (the turn is read from the prompt)."""

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, k, sampling, seeds=None):
        self.prompts.append(list(prompts))
        texts = []
        for prompt in prompts:
            turn = prompt.count("NEXT")
            texts += [f"t{turn}s{j}" for j in range(k)]
        tokens = [torch.tensor([7, 8]) for _ in texts]
        return Completions([torch.tensor([1, 2]) for _ in prompts], tokens, texts, k)


def parse(text):
    return int(text[1]), int(text[3])  # (turn, sample)


def turn_reward(c1, c2):
    # (turn + 1) * (sample of agent 0 + 1): turn 0 -> [1, 2], turn 1 -> [2, 4]
    return [(parse(a)[0] + 1) * (parse(a)[1] + 1) for a in c1]


def tree(num_turns=2, k=2, joint_mode="aligned", discount=0.5, threshold=None, transition=None, reward=turn_reward,
         formatters=None, passthrough=False):
    gens = [ScriptedGenerator(), ScriptedGenerator()]
    calls = []

    def default_transition(**kwargs):
        calls.append(kwargs)
        return [f"NEXT {c}" for c in kwargs["agent_completions"]]

    rollout = TreeRollout(
        generators=gens,
        formatters=build_formatters(formatters, 2, pass_none_external_prompts=False),
        reward=RewardFunction(reward, 2),
        num_generations=k,
        num_turns=num_turns,
        joint_mode=joint_mode,
        discount=discount,
        sampling=SamplingParams(max_new_tokens=4),
        early_termination_threshold=threshold,
        external_transition=transition or default_transition,
        external_prompt_passthrough=passthrough,
    )
    return rollout, gens, calls


def test_aligned_two_turn_returns_with_discount():
    rollout, gens, calls = tree()
    result = rollout.run([{"prompt": "task"}])
    root = result.roots[0]
    # turn 0 rewards [1, 2]; each child (turn 1) has rewards [2, 4], mean return 3
    # root returns: [1 + 0.5 * 3, 2 + 0.5 * 3] = [2.5, 3.5]
    assert_close(root.rewards, torch.tensor([1.0, 2.0]))
    assert_close(root.returns, torch.tensor([2.5, 3.5]))
    assert_close(root.children[0].returns, torch.tensor([2.0, 4.0]))
    assert result.env_steps == 6  # 2 joint rewards at the root + 2 in each of the 2 children
    assert result.turn_metrics == {
        "turn_1/reward_mean": 1.5, "turn_1/expected_return": 3.0,
        "turn_2/reward_mean": 3.0, "turn_2/expected_return": 3.0,
    }
    # one generate call per agent per level: the root level, then both children together
    assert [len(p) for p in gens[0].prompts] == [1, 2]
    # 3 nodes x 2 agents; each agent's credit at the root is the node's returns
    assert len(result.samples) == 6
    root_samples = [s for s in result.samples if s.turn_idx == 0]
    assert all(torch.equal(s.returns, root.returns) for s in root_samples)


def test_transition_receives_the_branch_histories_and_its_prompts_reach_the_agents():
    rollout, gens, calls = tree()
    rollout.run([{"prompt": "task"}])
    assert len(calls) == 2  # one per branch of the root
    first = calls[0]
    assert first["prompt"] == "task" and first["num_agents"] == 2
    assert first["agent_completions"] == ["t0s0", "t0s0"]
    assert first["prompt_history_per_agent"] == [["task"], ["task"]]
    assert first["response_history_per_agent"] == [["t0s0"], ["t0s0"]]
    assert calls[1]["agent_completions"] == ["t0s1", "t0s1"]
    assert gens[1].prompts[1] == ["NEXT t0s0", "NEXT t0s1"]


def test_passthrough_uses_transition_prompts_verbatim():
    def formatter(item, external_prompts=None):
        return f"[formatted] {item['prompt']}"

    rollout, gens, _ = tree(formatters=formatter)
    rollout.run([{"prompt": "task"}])
    assert gens[0].prompts == [["[formatted] task"], ["[formatted] NEXT t0s0", "[formatted] NEXT t0s1"]]
    rollout, gens, _ = tree(formatters=formatter, passthrough=True)
    rollout.run([{"prompt": "task"}])
    assert gens[0].prompts == [["[formatted] task"], ["NEXT t0s0", "NEXT t0s1"]]


def test_no_discount_sums_rewards():
    rollout, _, _ = tree(discount=1.0)
    root = rollout.run([{"prompt": "task"}]).roots[0]
    assert_close(root.returns, torch.tensor([4.0, 5.0]))  # [1 + 3, 2 + 3]


def test_early_termination_stops_expanding_a_node():
    rollout, gens, calls = tree(threshold=1.4)  # root mean reward 1.5 > 1.4
    result = rollout.run([{"prompt": "task"}])
    assert not result.roots[0].children and calls == [] and len(gens[0].prompts) == 1
    assert_close(result.roots[0].returns, torch.tensor([1.0, 2.0]))
    rollout, _, _ = tree(threshold=1.6)  # 1.5 is not above 1.6: expands
    assert rollout.run([{"prompt": "task"}]).roots[0].children


def test_cross_mode_credits_each_completion_with_its_mean_joint_return():
    def reward(c1, c2):  # s0 + 2 * s1
        return [parse(a)[1] + 2 * parse(b)[1] for a, b in zip(c1, c2)]

    rollout, _, _ = tree(num_turns=1, joint_mode="cross", reward=reward)
    result = rollout.run([{"prompt": "task"}])
    # joint order (0,0) (0,1) (1,0) (1,1): rewards 0, 2, 1, 3
    assert_close(result.roots[0].rewards, torch.tensor([0.0, 2.0, 1.0, 3.0]))
    agent0, agent1 = result.samples
    assert_close(agent0.returns, torch.tensor([1.0, 2.0]))  # mean(0, 2), mean(1, 3)
    assert_close(agent1.returns, torch.tensor([0.5, 2.5]))  # mean(0, 1), mean(2, 3)
    assert result.env_steps == 4


def test_cross_mode_two_turns_expands_every_joint_action():
    rollout, gens, calls = tree(joint_mode="cross")
    result = rollout.run([{"prompt": "task"}])
    assert len(calls) == 4 and len(result.roots[0].children) == 4
    assert result.env_steps == 4 + 4 * 4


def test_several_items_share_each_generate_call():
    rollout, gens, _ = tree()
    result = rollout.run([{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}])
    assert [len(p) for p in gens[0].prompts] == [3, 6]
    assert len(result.roots) == 3 and result.env_steps == 18


def test_transition_must_return_one_prompt_per_agent():
    rollout, _, _ = tree(transition=lambda **kw: ["only one"])
    with pytest.raises(ValueError, match="External transition must return per-agent prompts: a list of 2 strings"):
        rollout.run([{"prompt": "task"}])
    rollout, _, _ = tree(transition=lambda **kw: ["ok", 3])
    with pytest.raises(ValueError, match="returned int for agent 1"):
        rollout.run([{"prompt": "task"}])


# ----------------------------------------------------------------------------- with real tiny models


def custom_external(prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None):
    """The multi-turn feedback example of the CoMLRL docs: ask every agent to revise."""
    return [f"{prompt}\nPrevious attempt: {agent_completions[i]}\nPlease revise." for i in range(num_agents)]


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_two_turn_magrpo_with_feedback_trains(tiny_paths, prompts_dataset):
    seen = []

    def transition(**kwargs):
        seen.append(kwargs)
        return custom_external(**kwargs)

    formatted = []

    def formatter(item, external_prompts=None):
        text = f"Agent task: {item['prompt']}"
        formatted.append((item["prompt"], external_prompts))
        return text

    trainer = MAGRPOTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]],
        reward_func=lambda c1, c2: [float(len(b) > len(a)) for a, b in zip(c1, c2)],
        formatters=formatter,
        external_transition=transition,
        args=MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=5, num_train_epochs=1, verbose=False,
                          early_termination_threshold=None, rollout_buffer_size=3, logging_steps=1, weight_decay=0.0),
        train_dataset=prompts_dataset,
    )
    before = [snapshot(a) for a in trainer.agents]
    trainer.train()
    assert all(changed(a, b) for a, b in zip(trainer.agents, before))
    assert len(seen) == 4 * 2  # every branch of every item
    first = seen[0]
    assert first["prompt"] == PROMPTS[0]
    assert first["prompt_history_per_agent"] == [[f"Agent task: {PROMPTS[0]}"]] * 2
    assert [len(h) for h in first["response_history_per_agent"]] == [1, 1]
    assert first["response_history_per_agent"][0][0] == first["agent_completions"][0]
    # second-turn prompts went through the formatter with the transition's prompt
    second_turn = [entry for entry in formatted if entry[1] is not None]
    assert second_turn and second_turn[0][0] == second_turn[0][1] and "Please revise." in second_turn[0][1]
    assert any("turn_2/reward_mean" in row for row in trainer.log_history)
    assert trainer.env_step == 4 * (2 + 2 * 2)
