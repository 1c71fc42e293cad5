"""MAGRPO end to end on tiny models: what trains, how it is batched, what is saved."""

import os
import random

import pytest
import torch
from tests.helpers.common import PROMPTS, changed, length_ratio, no_signal_expected, snapshot
from tests.helpers.direction import agent_steps
from tests.helpers.tolerances import adamw_gap, gradient_bound, scored_length
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MAReMaxTrainer,
    MARLOOTrainer,
)

# weight_decay=0: a model that changed got a gradient (AdamW's decay moves every weight on its own)
BASE = dict(num_turns=1, num_generations=2, max_new_tokens=6, num_train_epochs=1, verbose=False, agent_learning_rate=1e-3,
            weight_decay=0.0)


def config(**overrides):
    return MAGRPOConfig(**{**BASE, **overrides})


def trainer_for(paths, dataset, **overrides):
    return MAGRPOTrainer(agents=[paths["llama"], paths["gpt2"]], reward_func=length_ratio, args=config(**overrides), train_dataset=dataset)


def count_calls(model, name):
    counter = {"calls": 0, "rows": []}
    original = getattr(model, name)

    def wrapped(*args, **kwargs):
        if name == "generate" or torch.is_grad_enabled():  # forwards inside generate run without grad
            counter["calls"] += 1
            ids = kwargs.get("input_ids", args[0] if args else None)
            counter["rows"].append(int(ids.shape[0]))
        return original(*args, **kwargs)

    setattr(model, name, wrapped)
    return counter


def test_one_generate_and_one_forward_per_agent_per_buffer(tiny_paths, prompts_dataset):
    trainer = trainer_for(tiny_paths, prompts_dataset, num_generations=3, rollout_buffer_size=2)
    gens = [count_calls(agent, "generate") for agent in trainer.agents]
    fwds = [count_calls(agent, "forward") for agent in trainer.agents]
    trainer.train()
    for gen, fwd in zip(gens, fwds):
        # 4 items, 2 per buffer -> 2 steps; each: one generate of 2 prompts x 3 samples, one forward of 6 rows
        assert gen["calls"] == 2 and gen["rows"] == [6, 6]  # 2 prompts x 3 samples, one row each
        assert fwd["rows"] == [6, 6]  # the only forwards with gradient: one per update
    assert trainer.env_step == 4 * 3


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_cross_mode_scores_every_combination(tiny_paths, prompts_dataset):
    calls = []

    def reward(c1, c2):
        calls.append((list(c1), list(c2)))
        return [float(len(a) < len(b)) for a, b in zip(c1, c2)]

    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=reward,
                            args=config(joint_mode="crossed", num_generations=2), train_dataset=prompts_dataset)
    assert trainer.args.joint_mode == "cross"
    trainer.train()
    assert len(calls) == 4 and all(len(c1) == 4 for c1, _ in calls)  # K^N = 4 joint responses per item
    c1, c2 = calls[0]
    assert c1[0] == c1[1] and c1[2] == c1[3] and c2[0] == c2[2] and c2[1] == c2[3]  # product order
    assert trainer.env_step == 16


def eos_probability(model, tok, prompts):
    """Mean probability of ending the completion at once, over the prompts."""
    ids = [tok(p).input_ids for p in prompts]
    with torch.no_grad():
        probs = [torch.softmax(model(input_ids=torch.tensor([i])).logits[0, -1], -1)[tok.eos_token_id] for i in ids]
    return float(torch.stack(probs).mean())


def test_training_moves_the_log_probability_of_eos(tiny_paths, prompts_dataset):
    """A reward for short answers must raise P(EOS): the end token is scored (1.4.3 never scored it)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    # an untied head with a bias on EOS, so that ending early is sampled often enough to be learned
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        model.lm_head.bias.zero_()
        model.lm_head.bias[tok.eos_token_id] = 4.0
    prompts = list(prompts_dataset["prompt"])
    before = eos_probability(model, tok, prompts)
    trainer = MAGRPOTrainer(
        agents=[model], tokenizer=tok, num_agents=1, train_dataset=prompts_dataset,
        reward_func=lambda completions: [-float(len(c)) for c in completions],
        args=config(num_agents=1, num_generations=4, num_train_epochs=3, agent_learning_rate=5e-3, temperature=1.0, top_p=1.0),
    )
    trainer.train()
    after = eos_probability(model, tok, prompts)
    assert after > before + 0.05, (before, after)


def test_save_model_reload_and_continue(tiny_paths, prompts_dataset, tmp_path):
    trainer = trainer_for(tiny_paths, prompts_dataset)
    trainer.train()
    out = tmp_path / "models"
    trainer.save_model(str(out))
    for i, arch in enumerate(["LlamaForCausalLM", "GPT2LMHeadModel"]):
        model = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        tok = AutoTokenizer.from_pretrained(out / f"agent_{i}")
        assert type(model).__name__ == arch
        assert len(tok) == len(trainer.tokenizers[i])
        for saved, live in zip(model.parameters(), trainer.agents[i].parameters()):
            assert torch.equal(saved, live)
    # continue from the saved directories, exactly as the documented example does
    resumed = MAGRPOTrainer(agents=[str(out / "agent_0"), str(out / "agent_1")], reward_func=length_ratio,
                            args=config(), train_dataset=prompts_dataset)
    start = [snapshot(a) for a in resumed.agents]
    assert not changed(resumed.agents[0], snapshot(trainer.agents[0]))
    resumed.train()
    assert changed(resumed.agents[0], start[0]) and changed(resumed.agents[1], start[1])


def test_save_model_never_overwrites_silently(tiny_paths, prompts_dataset, tmp_path):
    trainer = trainer_for(tiny_paths, prompts_dataset)
    trainer.save_model(str(tmp_path))
    marker = tmp_path / "agent_1" / "config.json"
    stamp = marker.read_text()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        trainer.save_model(str(tmp_path))
    assert marker.read_text() == stamp
    trainer.save_model(str(tmp_path), overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["agent_0", "agent_1"]  # no staging leftovers


@pytest.mark.parametrize("cls, mode", [(MAREINFORCETrainer, "raw"), (MARLOOTrainer, "rloo"), (MAReMaxTrainer, "max")])
def test_variants_train_with_their_baseline(tiny_paths, prompts_dataset, cls, mode):
    trainer = cls(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio,
                  args=config(advantage_normalization=False), train_dataset=prompts_dataset)
    assert trainer.args.advantage_mode == mode and trainer.algorithm_name == cls.algorithm_name
    before = snapshot(trainer.agents[0])
    trainer.train()
    assert changed(trainer.agents[0], before)


def test_non_finite_loss_raises(tiny_paths, prompts_dataset):
    trainer = trainer_for(tiny_paths, prompts_dataset)
    original = trainer.agents[0].forward

    def poisoned(*args, **kwargs):
        output = original(*args, **kwargs)
        if torch.is_grad_enabled():
            output.logits = output.logits * float("nan")
        return output

    trainer.agents[0].forward = poisoned
    with pytest.raises(FloatingPointError, match="agent 0 .*policy loss is nan"):
        trainer.train()


def test_micro_batches_and_optimizer_schedules_give_the_same_update(tiny_paths, prompts_dataset):
    """The schedules compute the same update; the runs are in float64 so that the comparison does not
    depend on one machine's float order.

    Stepping the optimizer inside backward or after it, and clipping at a norm the gradients never
    reach (coefficient exactly 1.0), run the same operations on the same numbers: bit-identical.
    Micro-batches of 1 pad each forward differently, so the sums are rounded in another order. In
    float32 that moved parameters by ~1.3e-5 (Adam amplifies rounding in near-zero gradients); in
    float64 (unit 2**-53) by ~2.5e-14. The tolerance bounds it: the gradients are at most
    gradient_bound apart in float64 (relative to the logged gradient norm), which moves each AdamW step
    by at most tolerances.adamw_gap(..., grad_error); a wrong schedule (a dropped or doubled
    micro-batch) moves weights by ~lr = 1e-3.
    """
    results = []
    for overrides in ({}, {"update_micro_batch_size": 1}, {"optimizer_in_backward": False}, {"max_grad_norm": 1e9}):
        torch.manual_seed(0)
        trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio,
                                args=config(**overrides), train_dataset=prompts_dataset, model_config={"torch_dtype": torch.float64})
        torch.manual_seed(1)
        trainer.train()
        results.append([p.detach().clone() for agent in trainer.agents for p in agent.parameters()])
        if not overrides:
            norm = max(v for row in trainer.log_history for k, v in row.items() if k.endswith("grad_norm"))
            grad_error = max(gradient_bound(agent, scored_length(tok, PROMPTS[:4], BASE["max_new_tokens"]), torch.tensor(norm), torch.float64)
                             for agent, tok in zip(trainer.agents, trainer.tokenizers))
            atol = adamw_gap(BASE["agent_learning_rate"], agent_steps(trainer), grad_error=grad_error)
    assert results[0][0].dtype == torch.float64
    micro, in_backward_off, no_clip = results[1:]
    assert atol < 0.01 * BASE["agent_learning_rate"]  # (5e-6 here) far below what a wrong schedule moves
    for a, b in zip(results[0], micro):
        torch.testing.assert_close(a, b, atol=atol, rtol=0.0)
    for other in (in_backward_off, no_clip):
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_off_policy_generation_logs_importance_diagnostics(tiny_paths, prompts_dataset):
    trainer = trainer_for(tiny_paths, prompts_dataset, buffers_per_generation=2, rollout_buffer_size=1, logging_steps=1)
    gens = count_calls(trainer.agents[0], "generate")
    trainer.train()
    assert gens["calls"] == 2 and gens["rows"] == [4, 4]  # 2 buffers of 1 prompt x K=2 per generate call
    # every update reports the importance diagnostics (the ratios themselves: test_mechanisms.py)
    assert all({"agent_0/ratio", "agent_0/clip_fraction", "agent_1/approx_kl"} <= set(r) for r in trainer.log_history)


def test_stale_groups_are_importance_weighted(tiny_paths, prompts_dataset):
    """Two turns, K = 2, buffer 2: a tree yields 1 + 2 = 3 groups per agent, so each step updates on
    the root group and the first child, and the second child waits for the next step (after its agent
    stepped): that group, and turn 2's group after the turn-1 step, are consumed stale."""

    def transition(prompt, agent_completions, num_agents, **_):
        return [f"Revise: {c}" for c in agent_completions]

    trainer = MAGRPOTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio, external_transition=transition,
        args=config(num_turns=2, rollout_buffer_size=2, early_termination_threshold=None, logging_steps=1,
                    agent_learning_rate=5e-2, weight_decay=0.0),
        train_dataset=prompts_dataset,
    )
    trainer.train()
    rows = [r for r in trainer.log_history if "agent_0/stale_fraction" in r]
    # step 1 (rows average its two updates): the root group is fresh, the turn-2 group comes after the
    # turn-1 step -> 0.5; later steps also consume the leftover child of the previous step -> 2/3
    assert [round(r["agent_0/stale_fraction"], 4) for r in rows] == [0.5, 0.6667, 0.5, 0.6667]
    assert all(abs(r["agent_0/ratio"] - 1.0) > 1e-3 for r in rows)  # the stale groups' ratios moved off 1


def test_on_policy_runs_take_the_plain_policy_gradient(tiny_paths, prompts_dataset, monkeypatch):
    """One buffer per step, single turn, one minibatch: no group is ever stale, and the run is
    bit-identical to one whose staleness check is switched off (the on-policy update of old)."""
    import comlrl.trainers.update as update_module

    def run():
        trainer = trainer_for(tiny_paths, prompts_dataset, rollout_buffer_size=2, logging_steps=1)
        torch.manual_seed(0)
        random.seed(0)
        trainer.train()
        return trainer

    normal = run()
    assert all(r.get("agent_0/stale_fraction", 0.0) == 0.0 for r in normal.log_history)
    original = update_module.PolicyRows.add

    def never_stale(self, prompt, completion, advantage, weight, old=None, stale=False, reference=None):
        original(self, prompt, completion, advantage, weight, None, False, reference)

    monkeypatch.setattr(update_module.PolicyRows, "add", never_stale)
    plain = run()
    for a, b in zip(normal.agents, plain.agents):
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.equal(p, q)
