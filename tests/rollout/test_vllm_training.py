"""Training with the real vLLM engine on the CPU (``generation_backend="vllm"``): the policy learns in
the reward's direction, every generation samples from the trainer's current weights (dense, Conv1D
and LoRA agents, one turn and two), heterogeneous teams get one engine each, and the run's seed
decides the samples. Marked ``vllm``: run in CI's vLLM job (``.ci/run``), deselected elsewhere.

"Samples from the current weights" is measured by the engine's own log-probs: with top-k and top-p
off, vLLM's processed log-probs are the tempered distribution the trainer scores, so their mean gap
to the trainer's forward (``VLLMGenerator.engine_gap``) is float noise (< 1e-4) when the engine holds
the trainer's weights, and far larger after a step it missed (the control below)."""

import gc

import pytest
import torch
from peft import LoraConfig
from tests.helpers.common import length_ratio, prompt_dataset
from tests.helpers.direction import ONE_TOKEN, OTHER, PREFERRED, assert_preference_learned, completion_logprobs, preference_reward
from tests.helpers.vllm_models import assert_engine_holds, two_token_llama
from tests.rollout.test_vllm_backend import vllm_args
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.rollout.generation import SamplingParams
from comlrl.rollout.seeding import seed_everything
from comlrl.rollout.vllm_backend import VLLMGenerator, policy_weights
from comlrl.trainers.reinforce import MAGRPOTrainer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600), pytest.mark.usefixtures("real_engines")]

UNTRUNCATED = dict(top_k=None, top_p=1.0, temperature=0.7)
IN_SYNC = 1e-4


def record_gaps(trainer):
    """Per agent, the engine gap of every generation the trainer makes from now on."""
    gaps = [[] for _ in trainer.policies]
    for index, policy in enumerate(trainer.policies):
        generator = policy.generator
        assert isinstance(generator, VLLMGenerator) and generator.engine.__class__.__name__ == "VLLMEngine"
        original = generator.generate

        def generate(*args, _original=original, _generator=generator, _gaps=gaps[index], **kwargs):
            out = _original(*args, **kwargs)
            _gaps.append(_generator.engine_gap)
            return out

        generator.generate = generate
    return gaps


def synced_engine(policy):
    """The agent's engine after a generation (the generator pushes before generating, so after ``train``
    the engine still lacks the last step until the next generation)."""
    policy.generator.generate(["Tell a joke"], 1, SamplingParams(2, 0.7, 1.0, None))
    return policy.generator.engine


def close(trainer):
    for policy in trainer.policies:
        policy.generator.engine.close()


def test_training_with_the_engine_moves_the_policy_toward_the_reward(vllm_paths, tmp_path):
    """The engine samples "a" or "b" (a model that says little else, top-k 2, one token); the reward
    prefers "b": after training "b" is more likely and "a" less likely on every prompt."""
    path = two_token_llama(vllm_paths["llama"], str(tmp_path / "two-token"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = {text: tokenizer.convert_tokens_to_ids(text) for text in (PREFERRED, OTHER)}
    data = prompt_dataset(3)
    trainer = MAGRPOTrainer(agent_model=path, num_agents=1, reward_func=preference_reward, train_dataset=data,
                            args=vllm_args(num_agents=1, num_generations=4, rollout_buffer_size=1, agent_learning_rate=5e-3, **ONE_TOKEN))
    gaps = record_gaps(trainer)
    before = completion_logprobs(trainer.agents[0], tokenizer, data["prompt"], ids)
    trainer.train()
    after = completion_logprobs(trainer.agents[0], tokenizer, data["prompt"], ids)
    close(trainer)
    assert len(gaps[0]) == 3  # one generation by the engine per prompt
    assert_preference_learned(before, after)


def test_heterogeneous_agents_sample_from_their_current_weights(vllm_paths, prompts_dataset):
    """A Llama (dense layers) and a GPT-2 (Conv1D) agent, each with its own engine and tokenizer: every
    generation after the first step sees the step (engine gap float noise), the recorded log-probs
    are the trainer's (mismatch 0, fresh ratio 1); a step the engine missed is visible at once."""
    trainer = MAGRPOTrainer(agents=[vllm_paths["llama"], vllm_paths["gpt2"]], reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=vllm_args(agent_learning_rate=1e-2, weight_decay=0.0, **UNTRUNCATED))
    gaps = record_gaps(trainer)
    trainer.train()
    assert [len(g) for g in gaps] == [2, 2]
    assert all(g < IN_SYNC for agent in gaps for g in agent), gaps
    for index, kind in enumerate(("llama", "gpt2")):
        assert_engine_holds(synced_engine(trainer.policies[index]), kind, trainer.agents[index].state_dict())
        rows = [r for r in trainer.log_history if f"agent_{index}/logprob_mismatch" in r]
        assert rows and all(r[f"agent_{index}/logprob_mismatch"] == pytest.approx(0.0, abs=1e-5) for r in rows)
    # the control: change the agent behind the engine's back (no optimizer step, so no push)
    policy = trainer.policies[1]
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    policy.generator.generate(["Tell a joke"], 2, SamplingParams(4, 0.7, 1.0, None))
    assert policy.generator.engine_gap > 100 * IN_SYNC
    close(trainer)


def test_lora_agents_engine_holds_the_base_with_the_adapter_merged(vllm_paths, prompts_dataset):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = MAGRPOTrainer(agent_model=vllm_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=vllm_args(agent_learning_rate=5e-2, weight_decay=0.0, **UNTRUNCATED), peft_config=config)
    gaps = record_gaps(trainer)
    trainer.train()
    assert all(g < IN_SYNC for agent in gaps for g in agent), gaps
    for policy in trainer.policies:
        merged = dict(policy_weights(policy.model))
        base = AutoModelForCausalLM.from_pretrained(vllm_paths["llama"]).state_dict()
        name = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.allclose(merged[name], base[name])  # the adapter trained: the merge differs from the base
        assert_engine_holds(synced_engine(policy), "llama", merged)
    close(trainer)


def test_two_turns_sample_from_the_current_weights(vllm_paths, prompts_dataset):
    """Turn 2's prompts (the transition's revisions) go to the engine, after the turn-1 step."""

    def transition(prompt, agent_completions, num_agents, **_):
        return [f"Revise: {c}" for c in agent_completions]

    trainer = MAGRPOTrainer(agents=[vllm_paths["llama"], vllm_paths["gpt2"]], reward_func=length_ratio, external_transition=transition,
                            train_dataset=prompts_dataset,
                            args=vllm_args(num_turns=2, early_termination_threshold=None, agent_learning_rate=1e-2, weight_decay=0.0,
                                           **UNTRUNCATED))
    prompts = []
    engine = trainer.policies[0].generator.engine
    original = engine.generate
    engine.generate = lambda requests: prompts.extend(r.prompt_ids for r in requests) or original(requests)
    gaps = record_gaps(trainer)
    trainer.train()
    revised = [p for p in prompts if trainer.tokenizers[0].decode(p).startswith("Revise:")]
    assert revised and len(revised) < len(prompts)
    assert all(g < IN_SYNC for agent in gaps for g in agent), gaps
    close(trainer)


def completions_of_a_run(path, seed):
    seen = []

    def reward(completions):
        seen.extend(completions)
        return [float(len(c)) for c in completions]

    seed_everything(seed)
    trainer = MAGRPOTrainer(agent_model=path, num_agents=1, reward_func=reward, train_dataset=prompt_dataset(2),
                            args=vllm_args(num_agents=1, num_generations=4, max_new_tokens=6))
    trainer.train()
    close(trainer)
    del trainer
    gc.collect()
    return seen


def test_the_seed_decides_the_samples(vllm_paths):
    """vLLM's worker reseeds the process with 0 when it starts, so runs seeded 1 and 2 sampled the
    same completions; now the seed decides, and the same seed gives the same samples."""
    one, two, again = (completions_of_a_run(vllm_paths["llama"], seed) for seed in (1, 2, 1))
    assert len(one) == 8 and one == again
    assert one != two
