"""LoRA through peft (issue 12): one frozen base shared by every agent of the same model, one adapter
per agent, the reference = the base with adapters disabled, adapter-only optimizers and checkpoints,
save / merge / continue round trips, exact resume."""

import os
import random

import pytest
import torch
from tests.helpers.checkpoint_runs import assert_same_run, make_dataset, run_summary, seed_everything
from tests.helpers.common import LM_HEAD_ADAPTER_NOTES, length_ratio, no_signal_expected
from tests.helpers.tiny_models import CORPUS
from tests.helpers.tolerances import logit_bound
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models.lora import AdapterModel, BaseReference
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.checkpoint.layout import latest_checkpoint

pytestmark = LM_HEAD_ADAPTER_NOTES

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], lora_dropout=0.0)


def lora_args(**overrides):
    base = dict(num_turns=1, num_generations=4, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=1,
                agent_learning_rate=2e-2, weight_decay=0.0, temperature=1.0, top_p=1.0, top_k=None)
    return MAGRPOConfig(**{**base, **overrides})


def mean_length(model, tok, prompts, n=64):
    """Mean sampled completion length in tokens (up to EOS, at most 6) over the prompts, n samples each."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(123)
    total = 0.0
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tok(prompt).input_ids])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=6,
                                 num_return_sequences=n, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, top_k=0,
                                 top_p=1.0, temperature=1.0)[:, ids.shape[1]:]
            ended = out == tok.eos_token_id
            first = torch.where(ended.any(1), ended.int().argmax(1), torch.full((n,), out.shape[1]))
            total += float(first.float().mean())
    torch.random.set_rng_state(generator_state)
    return total / len(prompts)


def base_tensors(trainer):
    base = trainer.agents[0].shared.base
    return {n: p.detach().clone() for n, p in base.named_parameters() if "lora_" not in n}


@pytest.fixture(scope="module")
def eos_biased_dir(tiny_paths, tmp_path_factory):
    """The tiny llama with an untied head biased towards EOS, so ending early is sampled often enough to learn."""
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    model.config.tie_word_embeddings = False
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        # EOS's row gains the mean final hidden state of the corpus: P(EOS) of a few % to most of the mass
        states = torch.cat([model.model(input_ids=torch.tensor([tok(t).input_ids])).last_hidden_state[0]
                            for t in CORPUS.splitlines() if t.strip()])
        mean = states.mean(0)
        model.lm_head.weight[tok.eos_token_id] += 3.0 * mean / mean.norm() ** 2
    path = tmp_path_factory.mktemp("eos-biased") / "llama"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_two_agents_share_one_frozen_base_and_learn_opposite_things(eos_biased_dir, prompts_dataset):
    """Agent 0 is rewarded for short answers, agent 1 for long ones: through one shared base, agent 0's
    adapter shortens its sampled completions and agent 1's lengthens them, and the base does not change.
    (Lengths are measured by sampling, over every position: the first position's P(EOS) alone is
    nearly 0 or 1 per prompt for this model, so it cannot show what agent 0 learns.)"""
    tok = AutoTokenizer.from_pretrained(eos_biased_dir)
    prompts = list(prompts_dataset["prompt"])

    def reward(short, long):
        return [-float(len(a)) + float(len(b)) for a, b in zip(short, long)]

    trainer = MAGRPOTrainer(agent_model=eos_biased_dir, num_agents=2, reward_func=reward, train_dataset=prompts_dataset,
                            args=lora_args(num_train_epochs=3, max_new_tokens=6, num_generations=8), peft_config=LORA)
    a0, a1 = trainer.agents
    assert isinstance(a0, AdapterModel) and a0.shared is a1.shared
    # memory of the base is counted once: both agents run the very same weight storage
    weight = lambda agent: agent.shared.peft_model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight  # noqa: E731
    assert weight(a0).data_ptr() == weight(a1).data_ptr()
    assert all(not p.requires_grad for n, p in a0.shared.base.named_parameters() if "lora_" not in n)
    # the optimizers hold exactly the adapters (q, v and the head for 1 layer: 3 x (A, B))
    for agent, optimizer in zip(trainer.agents, trainer.optimizers):
        held = [p for g in optimizer.param_groups for p in g["params"]]
        assert len(held) == 6 and {id(p) for p in held} == {id(p) for p in agent.parameters()}
    assert not {id(p) for p in a0.parameters()} & {id(p) for p in a1.parameters()}

    base_before = base_tensors(trainer)
    before = [mean_length(a, tok, prompts) for a in trainer.agents]
    trainer.train()
    after = [mean_length(a, tok, prompts) for a in trainer.agents]
    assert after[0] < before[0] - 0.3 and after[1] > before[1] + 0.3, (before, after)
    for name, value in base_tensors(trainer).items():
        assert torch.equal(value, base_before[name]), name


def test_reference_is_the_base_with_adapters_disabled(tiny_paths, prompts_dataset):
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=lora_args(reference_kl_enabled=True), peft_config=LORA)
    ref0, ref1 = trainer.reference_models
    assert isinstance(ref0, BaseReference) and ref0 is ref1 and not list(ref0.parameters())  # no copy
    trainer.train()
    original = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    ids = torch.tensor([[5, 9, 17, 33, 40]])
    with torch.no_grad():
        torch.testing.assert_close(ref0(input_ids=ids).logits, original(input_ids=ids).logits)
        assert not torch.allclose(trainer.agents[0](input_ids=ids).logits, original(input_ids=ids).logits)
    assert any("turn_1/reference_kl_mean" in row for row in trainer.log_history)


def test_save_load_merge_and_continue(tiny_paths, prompts_dataset, tmp_path):
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
                            args=lora_args(), peft_config=LORA)
    trainer.train()
    ids = torch.tensor([[5, 9, 17, 33, 40]])
    with torch.no_grad():
        live = [agent(input_ids=ids).logits for agent in trainer.agents]
    trainer.save_model(str(tmp_path / "adapters"))
    trainer.save_model(str(tmp_path / "merged"), merge_adapters=True)
    for i, agent in enumerate(trainer.agents):
        folder = tmp_path / "adapters" / f"agent_{i}"
        assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(os.listdir(folder))
        with torch.no_grad():
            torch.testing.assert_close(agent(input_ids=ids).logits, live[i], rtol=0, atol=0)  # merging left the base alone
            loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_paths["llama"]), str(folder))
            torch.testing.assert_close(loaded(input_ids=ids).logits, live[i], rtol=0, atol=0)  # the same weights, the same forward
            merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / f"agent_{i}")
            assert not any("lora" in n for n, _ in merged.named_parameters())
            # W + s B A rounded into one weight vs W x + s B (A x): float32 rounding along a chain longer by the rank
            atol = 2 * logit_bound(merged, ids.shape[1], extra_terms=LORA.r)
            torch.testing.assert_close(merged(input_ids=ids).logits, live[i], rtol=0, atol=atol)
    # adapter folders given back as agents continue from the trained adapters, on one shared base again
    resumed = MAGRPOTrainer(agents=[str(tmp_path / "adapters" / "agent_0"), str(tmp_path / "adapters" / "agent_1")],
                            reward_func=length_ratio, train_dataset=prompts_dataset, args=lora_args())
    assert resumed.agents[0].shared is resumed.agents[1].shared
    for old, new in zip(trainer.agents, resumed.agents):
        assert list(old.state_dict()) == list(new.state_dict())
        for (name, p), q in zip(old.state_dict().items(), new.state_dict().values()):
            assert torch.equal(p, q), name
    start = [p.detach().clone() for p in resumed.agents[1].parameters()]
    resumed.train()
    assert any(not torch.equal(a, b) for a, b in zip(start, resumed.agents[1].parameters()))


def make_lora_magrpo(paths, dataset, reward=length_ratio):
    return MAGRPOTrainer(agent_model=paths["llama"], num_agents=2, reward_func=reward, train_dataset=dataset,
                         args=lora_args(num_train_epochs=2, num_generations=2, rollout_buffer_size=2, reference_kl_enabled=True),
                         peft_config=LORA)


def test_resume_from_a_step_checkpoint_is_bit_identical(tiny_paths, tmp_path):
    dataset = make_dataset(4)
    seed_everything(0)
    straight = make_lora_magrpo(tiny_paths, dataset)
    straight.train()
    expected = run_summary(straight)

    seed_everything(0)
    first = make_lora_magrpo(tiny_paths, dataset)
    first.train(checkpoint_dir=str(tmp_path), checkpoint_steps=1)
    step = tmp_path / "checkpoint-step-3"
    manifest_models = os.listdir(step / "models")
    assert sorted(manifest_models) == ["agents.0", "agents.1"]  # adapters only: no base, no reference copy
    saved_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(step / "models") for f in fs)
    adapter_bytes = sum(p.numel() * 4 for a in first.agents for p in a.parameters())
    assert saved_bytes < adapter_bytes + 64 * 1024

    random.seed(99)
    torch.manual_seed(99)
    resumed = make_lora_magrpo(tiny_paths, dataset)
    resumed.train(resume_from_checkpoint=str(step))
    assert_same_run(expected, run_summary(resumed))
    assert latest_checkpoint(str(tmp_path))


def test_lists_of_configs_mix_lora_and_full_fine_tuning(tiny_paths, prompts_dataset):
    trainer = MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=length_ratio,
                            train_dataset=prompts_dataset, args=lora_args(rollout_buffer_size=2), peft_config=[LORA, None])
    assert isinstance(trainer.agents[0], AdapterModel) and not isinstance(trainer.agents[1], AdapterModel)
    full = sum(p.numel() for p in trainer.agents[1].parameters())
    assert sum(p.numel() for g in trainer.optimizers[1].param_groups for p in g["params"]) == full
    trainer.train()


@pytest.mark.parametrize(
    "peft_config, match",
    [([LORA], r"peft_config has 1 entries for 2 models"), ({"r": 8}, r"peft_config\[0\] must be a peft config"),
     (LoraConfig(r=4, target_modules=["q_proj"], inference_mode=True), "inference_mode=True")],
)
def test_bad_peft_configs_are_refused_before_loading(peft_config, match):
    with pytest.raises(ValueError, match=match):
        MAGRPOTrainer(agent_model="/nonexistent/model", num_agents=2, reward_func=length_ratio, args=lora_args(),
                      peft_config=peft_config)


def test_maac_actors_and_critic_share_one_base(tiny_paths, prompts_dataset, tmp_path):
    trainer = MAACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
                          train_dataset=prompts_dataset.select(range(2)), peft_config=LORA, critic_peft_config=LORA,
                          args=MAACConfig(num_turns=1, num_agents=2, max_new_tokens=3, num_train_epochs=1, rollout_buffer_size=2,
                                          verbose=False, critic_learning_rate=1e-2))
    critic = trainer.critics[0]
    assert critic.model.shared is trainer.agents[0].model.shared is trainer.agents[1].model.shared
    assert sorted(critic.model.shared.adapters) == ["agent_0", "agent_1", "critic_0"]
    head = [p.detach().clone() for p in critic.value_head.parameters()]
    trainer.train()
    assert all(not torch.equal(a, b) for a, b in zip(head, critic.value_head.parameters()))
    trainer.save_model(str(tmp_path / "out"))
    assert {"adapter_config.json", "value_head.pt"} <= set(os.listdir(tmp_path / "out" / "critic"))


def test_iac_value_heads_on_lora_actors_train(tiny_paths, prompts_dataset):
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=length_ratio, train_dataset=prompts_dataset.select(range(2)),
                         peft_config=LORA,
                         args=IACConfig(num_turns=1, num_agents=2, max_new_tokens=3, num_train_epochs=1, rollout_buffer_size=2,
                                        verbose=False, use_separate_critic=False))
    actor = trainer.agents[0]
    held = {id(p) for g in trainer.agent_optimizers[0].param_groups for p in g["params"]}
    assert held == {id(p) for p in actor.parameters()} and {id(p) for p in actor.value_head.parameters()} <= held
    trainer.train()
    with pytest.raises(ValueError, match="critic_peft_config was given but there is no critic"):
        IACTrainer(agent_model="/nonexistent/model", reward_func=length_ratio, critic_peft_config=LORA,
                   args=IACConfig(num_turns=1, use_separate_critic=False))
