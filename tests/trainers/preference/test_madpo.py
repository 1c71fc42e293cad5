"""MADPO on tiny models: collection batching, the joint-margin update, its direction, centralized teams."""

import pytest
import torch
from tests.helpers.common import changed, length_ratio, snapshot
from tests.helpers.tolerances import adamw_gap, gradient_bound, logprob_bound, rounding_bound

from comlrl.trainers.preference import MADPOConfig, MADPOTrainer
from comlrl.trainers.preference.collection import AgentPreferenceTensors, PreferencePair

BASE = dict(num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=6,
            verbose=False, agent_learning_rate=1e-3, eval_interval=0, weight_decay=0.0, logging_steps=1)


def make(paths, dataset, reward=length_ratio, **overrides):
    return MADPOTrainer(agents=[paths["llama"], paths["gpt2"]], reward_func=reward, train_dataset=dataset,
                        args=MADPOConfig(**{**BASE, **overrides}))


def count(model, name):
    calls = []
    original = getattr(model, name)

    def wrapped(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        calls.append((int(ids.shape[0]), torch.is_grad_enabled()))
        return original(*args, **kwargs)

    setattr(model, name, wrapped)
    return calls


class CountingReward:
    def __init__(self):
        self.calls = []

    def __call__(self, c1, c2):
        self.calls.append(len(c1))
        return length_ratio(c1, c2)


def test_collection_is_batched_and_scored_once_per_item(tiny_paths, prompts_dataset):
    reward = CountingReward()
    trainer = make(tiny_paths, prompts_dataset, reward, collection_batch_size=4)
    gens = [count(agent, "generate") for agent in trainer.agents]
    trainer.train()
    assert [len(g) for g in gens] == [1, 1] and gens[0][0][0] == 16  # 4 prompts x 4 samples (one row each) in one call per agent
    assert reward.calls == [4, 4, 4, 4]  # one call per item over its 4 joint candidates
    assert len(trainer.preference_pairs) <= 4 * 2


def test_one_update_forward_layout(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, train_batch_size=2)
    trainer.train()  # collect pairs
    pairs = trainer.preference_pairs[:2]
    forwards = [count(agent, "forward") for agent in trainer.agents]
    trainer.step.update(pairs)
    # both agents on the CPU: one graph at a time. Agent 1's margins first without gradient (for
    # agent 0's step), then one forward with gradient per agent over winners and losers (4 rows)
    assert not trainer.step.joint_backward(pairs)
    assert forwards[0] == [(4, True)] and forwards[1] == [(4, False), (4, True)]
    # agents on devices of their own: one forward with gradient each, one joint backward
    joint = make(tiny_paths, prompts_dataset, train_batch_size=2)
    joint.step.joint_backward = lambda _pairs: True
    forwards = [count(agent, "forward") for agent in joint.agents]
    joint.step.update(pairs)
    assert forwards == [[(4, True)], [(4, True)]]
    micro = make(tiny_paths, prompts_dataset, train_batch_size=2, update_micro_batch_size=1)
    forwards = [count(agent, "forward") for agent in micro.agents]
    micro.step.update(pairs)
    # micro-batches: agent 1's margins first without gradient (for agent 0's step), then each agent
    # one forward with gradient per micro-batch (1 pair -> 2 rows)
    assert forwards[0] == [(2, True), (2, True)]
    assert forwards[1] == [(2, False), (2, False), (2, True), (2, True)]


def test_joint_and_micro_batched_updates_agree(tiny_paths, prompts_dataset):
    """The single joint backward and the agent-by-agent micro-batched steps give every agent the
    gradient of the joint loss at the same weights: the same update."""
    trainer = make(tiny_paths, prompts_dataset, train_batch_size=2)
    trainer.train()
    pairs = trainer.preference_pairs[:2]
    results = []
    for joint in (True, False):
        seeded = make(tiny_paths, prompts_dataset, train_batch_size=2, update_micro_batch_size=None if joint else 1,
                      agent_learning_rate=5e-3)
        seeded.step.joint_backward = lambda _pairs, _joint=joint: _joint
        metrics = seeded.step.update(pairs)
        results.append(([snapshot(a) for a in seeded.agents], metrics))
    (joint, m_joint), (micro, m_micro) = results
    # one AdamW step (lr 5e-3) from the same weights: a weight moves by less than lr, and rounding in a
    # gradient near zero may turn its direction, so the two are within adamw_gap(lr, 1) = 2 lr
    for a, b in zip(joint, micro):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=adamw_gap(5e-3, 1), rtol=0)
    # the metrics come before the step: float32 forwards (margins: 2 logprob_bound per scored token,
    # the loss is 0.1-Lipschitz in them) and gradients (gradient_bound, normwise) in another order
    bounds = margin_bounds(seeded, pairs)
    assert m_joint["agent_0/logp_margin"] == pytest.approx(m_micro["agent_0/logp_margin"], rel=0, abs=bounds[0])
    assert m_joint["madpo/loss"] == pytest.approx(m_micro["madpo/loss"], rel=0, abs=0.1 * sum(bounds) + rounding_bound(4, 1.0))
    for i, agent in enumerate(seeded.agents):
        key = f"agent_{i}/grad_norm"
        length = max(len(p.agent_tensors[i].prompt_input_ids) + len(p.agent_tensors[i].winner_completion_ids) for p in pairs)
        tol = gradient_bound(agent, length, torch.tensor(m_joint[key]))
        assert m_joint[key] == pytest.approx(m_micro[key], rel=0, abs=tol), key


def margin_bounds(trainer, pairs):
    """Per agent, how far two float32 forwards' pair margins (winner minus loser log-probs, summed over
    their tokens) can be apart: 2 logprob_bound per scored token of the longest pair."""
    bounds = []
    for i, agent in enumerate(trainer.agents):
        parts = [p.agent_tensors[i] for p in pairs]
        length = max(len(t.prompt_input_ids) + max(len(t.winner_completion_ids), len(t.loser_completion_ids)) for t in parts)
        tokens = max(len(t.winner_completion_ids) + len(t.loser_completion_ids) for t in parts)
        bounds.append(2 * tokens * logprob_bound(agent, length))
    return bounds


def _pair(trainer, texts=("aaa", "b")):
    tensors = []
    for policy in trainer.policies:
        enc = lambda t: torch.tensor(policy.tokenizer(t, add_special_tokens=False)["input_ids"] + [policy.generator.eos_ids[0]])  # noqa: E731
        tensors.append(AgentPreferenceTensors(torch.tensor(policy.tokenizer("Tell a joke")["input_ids"]), enc(texts[0]), enc(texts[1])))
    return PreferencePair(["Tell a joke"] * 2, [texts[0]] * 2, [texts[1]] * 2, tensors, 1.0, 0.0, 0.5)


def test_a_step_raises_every_agents_winner_margin(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, agent_learning_rate=5e-3)
    pairs = [_pair(trainer), _pair(trainer, ("a story of towers", "x"))]
    before = [trainer.step.pair_margins(i, pairs) for i in range(2)]
    metrics = trainer.step.update(pairs)
    after = [trainer.step.pair_margins(i, pairs) for i in range(2)]
    bounds = margin_bounds(trainer, pairs)  # the update's forward and _pair_margins' are two float32 forwards
    for i in range(2):
        assert bool((after[i] > before[i]).all()), (i, before[i], after[i])
        assert metrics[f"agent_{i}/logp_margin"] == pytest.approx(float(before[i].mean()), abs=bounds[i])
    joint = before[0] + before[1]
    # beta = 0.1 times the joint margin; -logsigmoid is 1-Lipschitz
    assert metrics["madpo/reward_margin"] == pytest.approx(0.1 * float(joint.mean()), abs=0.1 * sum(bounds) + rounding_bound(4, 1.0))
    assert metrics["madpo/loss"] == pytest.approx(float(-torch.nn.functional.logsigmoid(0.1 * joint).mean()), abs=0.1 * sum(bounds) + rounding_bound(4, 1.0))


def test_every_completion_token_counts_eos_included(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset)
    pair = _pair(trainer)
    with_eos = trainer.step.pair_margins(0, [pair])
    t = pair.agent_tensors[0]
    pair.agent_tensors[0] = AgentPreferenceTensors(t.prompt_input_ids, t.winner_completion_ids[:-1], t.loser_completion_ids)
    assert float(trainer.step.pair_margins(0, [pair])) != float(with_eos)  # the winner's EOS is scored


def test_training_end_to_end(tiny_paths, prompts_dataset):
    with pytest.raises(ValueError, match="reference_kl_enabled=True is not used by MADPO"):  # its loss has no KL term
        make(tiny_paths, prompts_dataset, reference_kl_enabled=True)
    trainer = make(tiny_paths, prompts_dataset, num_train_epochs=2)
    before = [snapshot(a) for a in trainer.agents]
    trainer.train()
    assert trainer.reference_models == []  # the loss never uses a reference, so none is loaded
    pairs = len(trainer.preference_pairs)
    assert pairs > 0 and trainer.env_step == 2 * pairs * 2  # environment_steps_per_pair x pairs x epochs
    assert all(changed(a, b) for a, b in zip(trainer.agents, before))
    rows = [r for r in trainer.log_history if "madpo/loss" in r]
    assert rows and all(0.0 <= r["madpo/accuracy"] <= 1.0 for r in rows)
    assert any("collect/reward_mean" in r for r in trainer.log_history)
    for pair in trainer.preference_pairs:
        assert pair.winner_reward > pair.loser_reward and len(pair.agent_tensors) == 2


def test_no_pairs_means_no_update(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, reward=lambda c1, c2: [1.0] * len(c1))
    before = snapshot(trainer.agents[0])
    trainer.train()
    assert trainer.preference_pairs == [] and not changed(trainer.agents[0], before) and trainer.env_step == 0


def test_a_nan_loss_raises(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset)
    with torch.no_grad():
        for p in trainer.agents[0].parameters():
            p.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="MADPO agent 0"):
        trainer.step.update([_pair(trainer)])


def test_evaluation_counts_updates(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, eval_interval=2, eval_num_samples=1, train_batch_size=1)
    trainer.eval_dataset = prompts_dataset
    trainer.train()
    evals = [r for r in trainer.log_history if "eval/turn_1/reward_mean" in r]
    assert len(evals) == (len(trainer.preference_pairs) + 1) // 2  # before updates 0, 2, 4, ...


def test_pair_selection_modes(tiny_paths, prompts_dataset):
    everything = make(tiny_paths, prompts_dataset, pair_selection="all", preference_pairs_per_sample=None)
    everything.train()
    capped = make(tiny_paths, prompts_dataset, pair_selection="random", preference_pairs_per_sample=1)
    capped.train()
    assert len(capped.preference_pairs) <= 4 < len(everything.preference_pairs)


class RoleReward:
    def __init__(self):
        self.calls = []

    def __call__(self, c1, c2, c3, batch_items=None):
        self.calls.append((list(c1), list(c2), list(c3)))
        return [float(len(a) + 2 * len(b) - len(c)) for a, b, c in zip(c1, c2, c3)]


def test_centralized_mode_trains_one_joint_actor(tiny_paths, prompts_dataset):
    reward = RoleReward()
    trainer = MADPOTrainer(agents=[tiny_paths["llama"]], reward_func=reward, train_dataset=prompts_dataset,
                           args=MADPOConfig(**{**BASE, "collaboration_mode": "centralized", "num_agents": 3}))
    assert trainer.num_agents == 1 and trainer.num_roles == 3 and trainer.args.num_agents == 3
    before = snapshot(trainer.agents[0])
    trainer.train()
    assert len(reward.calls) == 4 and all(len(call[0]) == 4 for call in reward.calls)  # one call per item, 3 role lists
    if trainer.preference_pairs:
        assert changed(trainer.agents[0], before)
        assert len(trainer.preference_pairs[0].agent_tensors) == 1


def test_centralized_checks(tiny_paths, prompts_dataset):
    args = MADPOConfig(**{**BASE, "collaboration_mode": "centralized"})
    with pytest.raises(ValueError, match="exactly one actor"):
        MADPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio, args=args)
    with pytest.raises(ValueError, match="num_agents must match args.num_agents"):
        MADPOTrainer(agents=[tiny_paths["llama"]], num_agents=3, reward_func=length_ratio, args=args)
    with pytest.raises(TypeError, match="build_prompt"):
        MADPOTrainer(agents=[tiny_paths["llama"]], reward_func=length_ratio, args=args, centralized_comparator_adapter=object())


def test_bad_reward_is_refused_before_loading(tiny_paths):
    with pytest.raises(ValueError, match="reward_func"):
        MADPOTrainer(agents=["/does/not/exist", "/nor/this"], reward_func=None, args=MADPOConfig(**BASE))
