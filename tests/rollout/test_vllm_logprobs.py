"""vLLM rollouts and the log-prob definition (issue 20, point 4): an engine whose reported log-probs
are of another distribution (vLLM's processed ones: truncated and renormalised by top-k / top-p)
changes neither the reference KL nor the stale rows' importance ratios, which use the trainer's
own tempered, untruncated forward everywhere."""

import math

import pytest
import torch
from tests.helpers.common import PROMPTS
from tests.helpers.tolerances import k3_noise, logprob_bound, ratio_bound, scored_length
from tests.rollout.test_vllm_backend import ScriptedEngine, vllm_args

from comlrl.rollout import vllm_backend
from comlrl.trainers.reinforce import MAGRPOTrainer


def _truncating_engines(monkeypatch, offset):
    made = []

    def factory(model, device, utilization):
        made.append(ScriptedEngine(model, logprob_offset=offset))  # log(p / Z) = log p - log Z > log p
        return made[-1]

    monkeypatch.setattr(vllm_backend, "ENGINE_FACTORY", factory)
    return made


def test_the_reference_kl_of_an_unchanged_policy_is_zero(tiny_paths, prompts_dataset, monkeypatch):
    """The first rollout is sampled from the initial policy, which is the reference: its KL must be 0
    whatever the engine reports (with the engine's renormalised values it was the offset per token)."""
    _truncating_engines(monkeypatch, offset=0.3)
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
                            train_dataset=prompts_dataset.select(range(2)), args=vllm_args(reference_kl_enabled=True, num_agents=1))
    trainer.train()
    first = trainer.log_history[0]
    # policy and reference are the same weights, so a token's d = log pi_ref - log pi is float32 noise,
    # |d| <= delta = 2 logprob_bound, and k3 summed over at most max_new_tokens tokens is below k3_noise
    tokens = vllm_args().max_new_tokens
    delta = 2 * logprob_bound(trainer.agents[0], scored_length(trainer.tokenizers[0], PROMPTS[:2], tokens), 0.7)
    assert first["turn_1/reference_kl_mean"] == pytest.approx(0.0, abs=k3_noise(delta, tokens))


def test_stale_rows_are_weighted_against_the_trainers_own_logprobs(tiny_paths, prompts_dataset, monkeypatch):
    """buffers_per_generation=2: the second buffer of a generation is stale after the first step; its
    ratio is pi_new / pi_sampling with pi_sampling the trainer's forward, so the engine offset does
    not enter (with the engine's values every ratio carried a factor e^{-0.3} per token)."""
    _truncating_engines(monkeypatch, offset=0.3)
    args = vllm_args(num_agents=1, rollout_buffer_size=1, buffers_per_generation=2, agent_learning_rate=1e-6, weight_decay=0.0)
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=length_ratio_one, train_dataset=prompts_dataset.select(range(2)),
                            args=args)
    trainer.train()
    ratios = [r["agent_0/ratio"] for r in trainer.log_history if "agent_0/ratio" in r]
    # a stale row is one AdamW step (lr 1e-6, each weight moves by at most lr on a first step) behind:
    # its log-probs move by at most lr * ||grad log pi||_1, and that L1 norm is 90-420 for these tiny
    # models' sampled tokens (1e3 taken); plus the float32 noise of a fresh ratio (ratio_bound). With the
    # engine's values every token's ratio would be e^-0.3 = 0.74.
    length = scored_length(trainer.tokenizers[0], PROMPTS[:2], args.max_new_tokens)
    tol = ratio_bound(trainer.agents[0], length, args.temperature) + math.expm1(args.agent_learning_rate * 1e3)
    assert ratios and all(r == pytest.approx(1.0, abs=tol) for r in ratios), ratios


def length_ratio_one(completions):
    return [float(len(c)) for c in completions]




def test_train_settings_the_engine_cannot_take_are_refused_before_the_first_step(tiny_paths, prompts_dataset, monkeypatch):
    engines = _truncating_engines(monkeypatch, offset=0.0)
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=length_ratio_one,
                            train_dataset=prompts_dataset.select(range(2)), args=vllm_args(num_agents=1))
    monkeypatch.setattr(trainer.step, "train_step", lambda *a, **k: pytest.fail("a training step started"))
    with pytest.raises(ValueError, match=r"generation_backend='vllm' does not forward train\(\) generation settings \['use_cache'\]"):
        trainer.train(use_cache=False)
    assert trainer.env_step == 0 and all(not e.requests for e in engines)
