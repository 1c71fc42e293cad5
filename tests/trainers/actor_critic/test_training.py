"""IAC and MAAC end to end on tiny models: every critic arrangement trains, and the work is batched
(no unused forwards, one backbone pass in shared-head mode, V once per prompt, MAAC's critic
stepped once per minibatch)."""

import pytest
import torch
from tests.helpers.common import PROMPTS, changed, length_ratio, no_signal_expected, snapshot
from tests.helpers.tolerances import gradient_bound, rounding_bound, scored_length, value_bound
from torch.testing import assert_close
from transformers import AutoTokenizer

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.actor_critic.updates import SharedValueLoss, rollout_values
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.scoring import score_completions

# weight_decay=0: a model that changed got a gradient (AdamW's decay moves every weight on its own)
BASE = dict(num_turns=1, num_generations=3, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=6,
            agent_learning_rate=1e-3, critic_learning_rate=1e-3, eval_interval=0, weight_decay=0.0)


@pytest.fixture(scope="module")
def toks(tiny_paths):
    return [AutoTokenizer.from_pretrained(tiny_paths["llama"]), AutoTokenizer.from_pretrained(tiny_paths["gpt2"])]


class Calls:
    """Counts forward calls (and rows) of a module with and without grad, outside ``generate``."""

    generating = False

    def __init__(self, module):
        self.grad, self.nograd = [], []
        original = module.forward

        def forward(*args, **kwargs):
            if not Calls.generating:
                ids = kwargs.get("input_ids", args[0] if args else None)
                (self.grad if torch.is_grad_enabled() else self.nograd).append(int(ids.shape[0]))
            return original(*args, **kwargs)

        module.forward = forward


def track_generate(model):
    original = model.generate

    def generate(*args, **kwargs):
        Calls.generating = True
        try:
            return original(*args, **kwargs)
        finally:
            Calls.generating = False

    model.generate = generate


def count_steps(optimizer):
    calls = []
    original = optimizer.step

    def step(label):
        calls.append(label)
        return original(label)

    optimizer.step = step
    return calls


def snapshots(trainer):
    return {name: snapshot(model) for name, model in trainer.named_models().items()}


def assert_all_changed(trainer, before):
    for name, model in trainer.named_models().items():
        assert changed(model, before[name]), f"{name} did not change"


def test_maac_heterogeneous_actors_and_central_critic(tiny_paths, toks, prompts_dataset):
    trainer = MAACTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=toks, critic_model=tiny_paths["llama"],
        reward_func=length_ratio, args=MAACConfig(**BASE), train_dataset=prompts_dataset,
    )
    for agent in trainer.agents:
        track_generate(agent.model)
    actors = [Calls(agent.model) for agent in trainer.agents]
    critic = Calls(trainer.critics[0].model.base_model)
    critic_steps = count_steps(trainer.critic_set.optimizers[0])
    before = snapshots(trainer)
    trainer.train()
    assert_all_changed(trainer, before)
    # 4 items, 2 per step (6 samples per agent per buffer), one minibatch per drain
    for calls in actors:
        assert calls.grad == [6, 6] and calls.nograd == []  # no old-log-prob forwards
    assert critic.nograd == [2, 2]  # rollout: one joint history per item, shared by agents and samples
    assert critic.grad == [2, 2]  # update: the same two rows, with gradient
    assert len(critic_steps) == 2  # once per minibatch, not once per agent
    assert trainer.env_step == 12
    row = trainer.log_history[-1]
    assert {"critic/value_loss", "agent_1/policy_loss", "turn_1/reward_mean"} <= set(row)


@pytest.mark.parametrize("critic_type, rows", [("v", 2), ("q", 6)])  # V once per prompt, Q once per completion
def test_iac_separate_critics_from_a_list(tiny_paths, toks, prompts_dataset, critic_type, rows):
    trainer = IACTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=toks, critics=[tiny_paths["llama"], tiny_paths["gpt2"]],
        reward_func=length_ratio, args=IACConfig(**BASE, critic_type=critic_type), train_dataset=prompts_dataset,
    )
    critics = [Calls(c.model.base_model) for c in trainer.critics]
    steps = [count_steps(o) for o in trainer.critic_set.optimizers]
    before = snapshots(trainer)
    trainer.train()
    assert_all_changed(trainer, before)
    for calls, step in zip(critics, steps):
        assert calls.nograd == [rows, rows] and calls.grad == [rows, rows] and len(step) == 2
    assert {"critic_0/value_loss", "critic_1/grad_norm"} <= set(trainer.log_history[-1])


def test_iac_separate_critics_from_a_broadcast_id(tiny_paths, prompts_dataset):
    trainer = IACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
        args=IACConfig(**BASE), train_dataset=prompts_dataset,
    )
    before = snapshots(trainer)
    trainer.train()
    assert_all_changed(trainer, before)
    c0, c1 = (list(c.parameters()) for c in trainer.critics)
    assert any(not torch.equal(a, b) for a, b in zip(c0, c1))  # independent critics learned differently


@pytest.mark.parametrize("critic_type", ["v", "q"])
def test_iac_shared_heads_learn_from_one_backbone_pass(tiny_paths, prompts_dataset, critic_type):
    trainer = IACTrainer(
        agent_model=tiny_paths["llama"], reward_func=length_ratio, train_dataset=prompts_dataset,
        args=IACConfig(**BASE, use_separate_critic=False, critic_type=critic_type, value_head_hidden_dim=8),
    )
    for agent in trainer.agents:
        track_generate(agent.model)
    lm = [Calls(agent.model) for agent in trainer.agents]
    body = [Calls(agent.model.base_model) for agent in trainer.agents]
    heads = [snapshot(agent.value_head) for agent in trainer.agents]
    before = snapshots(trainer)
    trainer.train()
    assert_all_changed(trainer, before)
    for agent, head in zip(trainer.agents, heads):
        assert changed(agent.value_head, head)
    value_rows = 2 if critic_type == "v" else 6  # V: one row per prompt; Q: one per completion
    for lm_calls, body_calls in zip(lm, body):
        assert lm_calls.grad == [6, 6] and lm_calls.nograd == []  # log-probs and values: one forward per update
        assert body_calls.nograd == [value_rows, value_rows]  # rollout values, transformer only
        assert body_calls.grad == [6, 6]  # inside the single LM forward, no second value pass
    assert "agent_0/value_loss" in trainer.log_history[-1]


@pytest.mark.parametrize("critic_type", ["v", "q"])
def test_value_from_the_actor_forward_equals_the_rollout_value(tiny_paths, critic_type):
    trainer = IACTrainer(agent_model=tiny_paths["gpt2"], reward_func=length_ratio,
                         args=IACConfig(**BASE, use_separate_critic=False, critic_type=critic_type))
    actor, pad = trainer.agents[0], trainer.policies[0].pad_id
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([8, 9])]
    completions = [torch.tensor([10, 11]), torch.tensor([12, 13, 14])]
    inputs = prompts if critic_type == "v" else [torch.cat(pc) for pc in zip(prompts, completions)]
    expected = rollout_values(actor, inputs, pad, None)
    batch = build_sequence_batch(prompts, completions, pad, "cpu", final_state=critic_type == "q")
    scores = score_completions(actor.model, batch, 0.6, with_hidden_states=True)
    captured = {}

    class Probe(SharedValueLoss):
        def __call__(self, scores, batch, rows):
            captured["loss"], captured["metrics"] = super().__call__(scores, batch, rows)
            return captured["loss"], captured["metrics"]

    samples = [type("S", (), {"value_target": torch.tensor(0.0), "old_value": torch.tensor(0.0)})() for _ in range(2)]
    Probe(actor.value_head, samples, coef=1.0, clip_range=None, final_state=critic_type == "q")(scores, batch, slice(0, 2))
    # loss = mean(V^2) and value_mean = mean(V) with targets 0: both match the rollout-time values up to
    # float32 rounding: two forwards' values are at most dv = 2 value_bound apart, so V^2 moves by at most
    # 2 |V| dv + dv^2, and the means over 2 rows round once more
    dv = 2 * value_bound(actor, actor.value_head, 5)
    worst = float(expected.abs().max())
    assert_close(captured["loss"].detach(), (expected**2).mean(), atol=2 * worst * dv + dv**2 + rounding_bound(3, worst**2), rtol=0)
    assert captured["metrics"]["value_mean"] == pytest.approx(float(expected.mean()), abs=dv + rounding_bound(3, worst))


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_maac_q_critic_and_per_agent_rewards(tiny_paths, prompts_dataset):
    seen = []

    def table_reward(c1, c2):
        return [[1.0] * len(c1), [0.0] * len(c2)]  # agent 0 always 1, agent 1 always 0

    trainer = MAACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=table_reward,
        args=MAACConfig(**{**BASE, "num_generations": 2}, critic_type="q"), train_dataset=prompts_dataset,
        metrics_callback=lambda rollouts: seen.extend(rollouts) or {"count": len(rollouts)},
    )
    before = snapshot(trainer.critics[0])
    trainer.train()
    assert changed(trainer.critics[0], before)
    assert {float(s.reward) for s in seen if s.agent_idx == 0} == {1.0} and {float(s.reward) for s in seen if s.agent_idx == 1} == {0.0}
    first = [s for s in seen if s.metadata["batch_item"] == seen[0].metadata["batch_item"]]
    assert len(first) == 4 and all(torch.equal(s.critic_input_ids, first[0].critic_input_ids) is (s.metadata["generation_idx"] == 0) for s in first)
    assert [row["count"] for row in trainer.log_history if "count" in row] == [4.0, 4.0]  # averaged over each step's items


def test_reused_buffer_passes_are_importance_weighted(tiny_paths, prompts_dataset):
    trainer = IACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio, train_dataset=prompts_dataset,
        args=IACConfig(**{**BASE, "train_batch_size": 3}, update_epochs=2, importance_clip_range=0.1, reference_kl_enabled=True),
    )
    track_generate(trainer.agents[0].model)
    calls = Calls(trainer.agents[0].model)
    trainer.train()
    # no scoring pass of the policy outside the updates: the old log-probs were recorded while sampling and
    # the KL needs only the reference's forward
    assert calls.nograd == []
    assert calls.grad == [3] * 8  # 2 drains x 2 passes x 2 minibatches
    row = trainer.log_history[-1]
    assert {"agent_0/ratio", "agent_0/clip_fraction", "agent_0/approx_kl", "turn_1/reference_kl_mean"} <= set(row)
    # the first minibatch of each drain is fresh, the other three stale: 3 of 4 steps importance-weighted
    stale = [r["agent_0/stale_fraction"] for r in trainer.log_history if "agent_0/stale_fraction" in r]
    assert stale and all(abs(v - 0.75) < 1e-9 for v in stale)
    assert len(trainer.reference_models) == 2 and trainer.reference_models[0] is trainer.reference_models[1]


def test_evaluate_runs_no_critic_and_averages_the_callback(tiny_paths, prompts_dataset):
    trainer = MAACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
        args=MAACConfig(**BASE, eval_num_samples=3, eval_batch_size=2), eval_dataset=prompts_dataset,
        metrics_callback=lambda rollouts: {"samples": len(rollouts), "ignored": "text"},
    )
    critic = Calls(trainer.critics[0].model.base_model)
    metrics = trainer.evaluate()
    assert set(metrics) == {"eval/turn_1/reward_mean", "eval/turn_1/expected_return", "eval/samples"}
    assert metrics["eval/samples"] == 2.0  # one greedy sample per agent per item
    assert critic.nograd == [] and critic.grad == []
    assert trainer.evaluate(num_eval_samples=0) == {}
    assert trainer.log_history[-1] == {"env_step": 0, **metrics}


def captured_gradients(optimizer, run):
    """Run one update and return the gradients its optimizer step saw (the step itself is skipped)."""
    grads = {}

    def step(label):
        for index, p in enumerate(optimizer.params):
            grads[index] = None if p.grad is None else p.grad.clone()
        optimizer.zero_grad()
        return 0.0

    optimizer.step = step
    run()
    return grads


def test_micro_batches_give_the_gradients_of_the_whole_minibatch(tiny_paths, prompts_dataset):
    trainer = IACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
                         args=IACConfig(**BASE, optimizer_in_backward=False))
    shared = IACTrainer(agent_model=tiny_paths["llama"], reward_func=length_ratio,
                        args=IACConfig(**BASE, optimizer_in_backward=False, use_separate_critic=False, critic_type="q"))
    for t in (trainer, shared):
        samples = t.step.collect(t.step.tree(t.task.reward, num_generations=3, greedy=False).run([prompts_dataset[0], prompts_dataset[1]]), training=True)
        agent0 = [s for item in samples for s in item if s.agent_idx == 0]
        for s in agent0:
            s.normalized_advantage = s.advantage
        results = []
        for micro in (None, 2):
            t.args.update_micro_batch_size = micro
            if t is trainer:  # the separate critic: 6 samples over 2 distinct prompts
                run = lambda: critic_step_of(t, agent0)  # noqa: E731
                results.append(captured_gradients(t.critic_set.optimizers[0], run))
            else:  # policy + value head of the same forward
                results.append(captured_gradients(t.policies[0].optimizer, lambda: t.step.actor_step(0, agent0)))
        whole, micro = results
        assert whole.keys() == micro.keys() and any(g is not None for g in whole.values())
        # micro-batches pad each forward to another width and sum in another order: float32 rounding only
        model = t.critics[0] if t is trainer else t.agents[0]
        length = scored_length(t.tokenizers[0], PROMPTS[:2], BASE["max_new_tokens"])
        for key in whole:
            if whole[key] is not None:
                torch.testing.assert_close(micro[key], whole[key], atol=gradient_bound(model, length, whole[key]), rtol=0)


def critic_step_of(trainer, samples):
    from comlrl.trainers.actor_critic.updates import critic_step

    return critic_step(trainer.critics[0], trainer.critic_set.optimizers[0], samples, pad_id=trainer.critic_set.pad_ids[0],
                       coef=0.6, clip_range=0.2, micro_batch_size=trainer.args.update_micro_batch_size, label="test")


def test_q_critic_advantage_favours_the_better_action(tiny_paths, prompts_dataset, monkeypatch):
    """A two-action bandit per prompt (K = 2, one turn) with an exact Q critic (Q = the reward): the
    better completion gets a positive advantage, the worse a negative one (1.4.3's TD error gave 0)."""
    seen = []

    def reward(c1, c2):
        return [[1.0, 0.0], [1.0, 0.0]]  # joint response 0 is the better action for both agents

    trainer = IACTrainer(
        agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=reward, train_dataset=prompts_dataset,
        args=IACConfig(**{**BASE, "num_generations": 2, "rollout_buffer_size": 2}, critic_type="q"),
        metrics_callback=lambda rollouts: seen.extend(rollouts) or {},
    )

    def exact_q(samples):
        for sample in samples:
            sample.old_value = sample.reward.clone()

    monkeypatch.setattr(trainer.step, "assign_old_values", exact_q)
    trainer.train()
    assert seen
    for sample in seen:
        expected = 1.0 if sample.metadata["generation_idx"] == 0 else -1.0  # Q minus the other sample's Q
        assert float(sample.advantage) == expected
