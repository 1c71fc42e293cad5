"""LoRA where it meets other features (issue 20): the reference is the policy as loaded, whatever
the adapter's initialisation; agents sharing one base train bit-identically with
parallel_training="mp"; mp with gradient checkpointing over a shared base is refused before loading."""

import pytest
import torch
from tests.helpers.common import LM_HEAD_ADAPTER_NOTES, PROMPTS, length_ratio, seed_all
from tests.helpers.tolerances import k3_noise, logprob_bound, scored_length
from peft import LoraConfig

from comlrl.models.lora import AdapterReference, BaseReference
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

IDS = torch.tensor([[5, 9, 17, 33, 40]])


pytestmark = LM_HEAD_ADAPTER_NOTES


def lora(init=True):
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], lora_dropout=0.0, init_lora_weights=init)


def args(**overrides):
    base = dict(num_turns=1, num_generations=4, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=1,
                agent_learning_rate=2e-2, weight_decay=0.0, temperature=1.0, top_p=1.0, top_k=None, logging_steps=1,
                reference_kl_enabled=True)
    return MAGRPOConfig(**{**base, **overrides})


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_a_non_zero_adapter_is_its_own_reference(tiny_paths, prompts_dataset):
    """init_lora_weights=False starts away from the base: the reference must be that start, not the
    base (which would penalise the inherited adapter), and stay there while the adapter trains."""
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=args(), peft_config=lora(init=False))
    ref0, ref1 = trainer.reference_models
    assert isinstance(ref0, AdapterReference) and ref0 is not ref1 and not list(ref0.parameters())
    initial = [logits(agent) for agent in trainer.agents]
    base = logits(trainer.agents[0].shared.base)
    assert not torch.allclose(initial[0], base)
    for ref, start in zip((ref0, ref1), initial):
        torch.testing.assert_close(logits(ref), start, rtol=0, atol=0)
    # the first rollout is sampled from the reference itself: its k3 KL is float noise (tolerances.k3_noise)
    tokens = args().max_new_tokens
    delta = max(2 * logprob_bound(a, scored_length(t, PROMPTS[:4], tokens)) for a, t in zip(trainer.agents, trainer.tokenizers))
    trainer.train()
    first = trainer.log_history[0]
    assert abs(first["turn_1/reference_kl_mean"]) <= k3_noise(delta, tokens)
    for ref, agent, start in zip((ref0, ref1), trainer.agents, initial):
        torch.testing.assert_close(logits(ref), start, rtol=0, atol=0)
        assert not torch.allclose(logits(agent), start)
    # the copies are frozen and belong to no optimizer or checkpoint
    held = {id(p) for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]}
    copies = [p for n, p in trainer.agents[0].shared.peft_model.named_parameters() if "__reference" in n]
    assert copies and not any(p.requires_grad or id(p) in held for p in copies)
    assert not any("__reference" in k for agent in trainer.agents for k in agent.state_dict())


def test_a_continued_adapter_is_its_own_reference(tiny_paths, prompts_dataset, tmp_path):
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=1, reward_func=lambda c: [float(len(x)) for x in c],
                            train_dataset=prompts_dataset, args=args(num_agents=1, reference_kl_enabled=False), peft_config=lora())
    trainer.train()
    trainer.save_model(str(tmp_path / "out"))
    continued = MAGRPOTrainer(agents=[str(tmp_path / "out" / "agent_0")], num_agents=1, reward_func=lambda c: [0.0] * len(c),
                              train_dataset=prompts_dataset, args=args(num_agents=1))
    (reference,) = continued.reference_models
    assert isinstance(reference, AdapterReference)
    torch.testing.assert_close(logits(reference), logits(trainer.agents[0]), rtol=0, atol=0)


def test_a_zero_initialised_adapter_keeps_the_bare_base_as_reference(tiny_paths, prompts_dataset):
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=args(), peft_config=lora())
    ref0, ref1 = trainer.reference_models
    assert type(ref0) is BaseReference and ref0 is ref1


def _adapters_after_one_epoch(paths, dataset, parallel):
    seed_all(0)
    extra = dict(parallel_training="mp", agent_devices=["cpu", "cpu"]) if parallel else dict(agent_devices=["cpu", "cpu"])
    trainer = MAGRPOTrainer(agent_model=paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=dataset,
                            args=args(rollout_buffer_size=2, train_batch_size=1, **extra), peft_config=lora(init=False))
    completions = []
    original = trainer.step.record_tree_signal
    trainer.step.record_tree_signal = lambda tree, result: completions.append(
        [s.completion_ids for s in result.samples]) or original(tree, result)
    trainer.train()
    state = [{k: v.detach().clone() for k, v in agent.state_dict().items()} for agent in trainer.agents]
    trainer.close()
    return state, completions, [row for row in trainer.log_history]


def test_mp_over_one_shared_base_is_bit_identical_to_the_sequential_run(tiny_paths, prompts_dataset):
    sequential, seq_completions, seq_log = _adapters_after_one_epoch(tiny_paths, prompts_dataset, parallel=False)
    threaded, mp_completions, mp_log = _adapters_after_one_epoch(tiny_paths, prompts_dataset, parallel=True)
    for a, b in zip(seq_completions, mp_completions):
        assert all(torch.equal(x, y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))
    for agent, (s, t) in enumerate(zip(sequential, threaded)):
        for name in s:
            assert torch.equal(s[name], t[name]), f"agent {agent} {name}: {float((s[name] - t[name]).abs().max())}"


def test_mp_with_gradient_checkpointing_over_a_shared_base_is_refused_before_loading(tiny_paths, prompts_dataset, monkeypatch):
    import comlrl.models.loading as loading

    loads = []
    monkeypatch.setattr(loading, "load_causal_lm", lambda *a, **k: loads.append(a) or pytest.fail("a model loaded"))
    with pytest.raises(ValueError, match=r"agents\[1\] would share its LoRA base on cpu with agents\[0\] under "
                                         r"parallel_training='mp' with gradient_checkpointing=True"):
        MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                      args=args(parallel_training="mp", agent_devices=["cpu", "cpu"], gradient_checkpointing=True), peft_config=lora())
    assert loads == []


def _maac_after_one_epoch(paths, dataset, parallel):
    from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer

    seed_all(0)
    devices = dict(agent_devices=["cpu", "cpu"], critic_devices=["cpu"], **({"parallel_training": "mp"} if parallel else {}))
    trainer = MAACTrainer(agent_model=paths["llama"], critic_model=paths["llama"], reward_func=length_ratio, train_dataset=dataset,
                          peft_config=lora(init=False), critic_peft_config=lora(init=False),
                          args=MAACConfig(num_turns=1, num_agents=2, max_new_tokens=3, num_train_epochs=1, rollout_buffer_size=2,
                                          num_generations=2, verbose=False, weight_decay=0.0, reference_kl_enabled=True, **devices))
    assert trainer.critics[0].model.shared is trainer.agents[0].model.shared  # actors and critic on one base
    trainer.train()
    models = [a.model for a in trainer.agents] + [trainer.critics[0].model]
    state = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
    trainer.close()
    return state


def test_mp_actors_and_critic_over_one_shared_base_are_bit_identical(tiny_paths, prompts_dataset):
    sequential = _maac_after_one_epoch(tiny_paths, prompts_dataset.select(range(2)), parallel=False)
    threaded = _maac_after_one_epoch(tiny_paths, prompts_dataset.select(range(2)), parallel=True)
    for index, (s, t) in enumerate(zip(sequential, threaded)):
        for name in s:
            assert torch.equal(s[name], t[name]), f"model {index} {name}"


def test_mp_with_gradient_checkpointing_refuses_a_critic_over_the_agents_base_before_loading(tiny_paths, prompts_dataset, monkeypatch):
    """The agents (two different models) share nothing, but the critic's LoRA base is agents[0]'s:
    the refusal names the critic and fires before the first model loads."""
    from transformers import AutoTokenizer

    import comlrl.models.loading as loading
    from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer

    tokenizers = [AutoTokenizer.from_pretrained(tiny_paths[name]) for name in ("llama", "gpt2")]
    monkeypatch.setattr(loading, "load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(ValueError, match=r"critics\[0\] would share its LoRA base on cpu with agents\[0\] under "
                                         r"parallel_training='mp' with gradient_checkpointing=True"):
        MAACTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=tokenizers, critic_model=tiny_paths["llama"],
                    reward_func=length_ratio, train_dataset=prompts_dataset, peft_config=lora(), critic_peft_config=lora(),
                    args=MAACConfig(num_turns=1, num_agents=2, max_new_tokens=3, num_generations=2, verbose=False, parallel_training="mp",
                                    agent_devices=["cpu", "cpu"], critic_devices=["cpu"], gradient_checkpointing=True))
