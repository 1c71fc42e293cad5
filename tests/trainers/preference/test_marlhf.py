"""MARLHF on tiny models: reward learning, every online-RL backend, entity rules, evaluation, export."""

import os

import pytest
import torch
from tests.helpers.common import changed, length_ratio, snapshot
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.core.logprobs import sequence_logprobs
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.scoring import score_completions
from comlrl.trainers.preference import MARLHFConfig, MARLHFTrainer

BASE = dict(num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=6, verbose=False,
            agent_learning_rate=1e-3, eval_interval=0, weight_decay=0.0, logging_steps=1, reward_model_device=None,
            num_generations=2, reward_learning_rate=1e-3)
ALGORITHMS = ["magrpo", "mareinforce", "maremax", "marloo", "iac", "maac"]


def make(paths, dataset, reward=length_ratio, **overrides):
    return MARLHFTrainer(agents=[paths["llama"], paths["gpt2"]], reward_func=reward, train_dataset=dataset,
                         args=MARLHFConfig(**{**BASE, **overrides}))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_backend_trains_agents_and_reward_head(tiny_paths, prompts_dataset, algorithm):
    trainer = make(tiny_paths, prompts_dataset, rl_algorithm=algorithm, reference_kl_enabled=True)
    agents, head = [snapshot(a) for a in trainer.agents], snapshot(trainer.reward_model.reward_head)
    initial = snapshot(trainer.agents[0])
    trainer.train()
    assert trainer.preference_pairs
    assert changed(trainer.reward_model.reward_head, head)
    assert all(changed(a, b) for a, b in zip(trainer.agents, agents))
    assert trainer.env_step == 4 * 2  # 4 items x num_generations, only the RL samples count
    # the KL reference is the initial policy, never the trained one
    assert len(trainer.reference_models) == 2 and not changed(trainer.reference_models[0], initial)
    keys = {k for row in trainer.log_history for k in row}
    assert {"reward_model/loss", "reward_model/accuracy", "reward_model/margin", "turn_1/reward_mean"} <= keys
    assert len(trainer.reward_optimizer.state) == 0  # moments released once the reward model is fixed


def learned_prefers_length(trainer):
    """Make the learned reward prefer longer joint texts (its scorer is replaced, the path is kept)."""
    trainer.reward_learning.scorer.score_texts = lambda texts, chunk=None: [float(len(t)) for t in texts]


def capture_samples(trainer):
    seen = []
    for policy in trainer.policies:
        original = policy.generator.generate

        def generate(prompts, k, sampling, seeds=None, _original=original, _policy=policy):
            out = _original(prompts, k, sampling, seeds)
            seen.append((_policy, out))
            return out

        policy.generator.generate = generate
    return seen


def sequence_logps(policy, completions):
    batch = build_sequence_batch([completions.prompt_ids[0]] * len(completions.tokens), completions.tokens, policy.pad_id, policy.device)
    with torch.no_grad():
        return sequence_logprobs(score_completions(policy.model, batch, 1.0).logprobs, batch.mask)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_backend_moves_toward_what_the_learned_reward_prefers(tiny_paths, prompts_dataset, algorithm):
    """One online-RL step on one item: for every agent, log pi(best) - log pi(worst) rises, where best and
    worst are the sampled joint responses the learned reward scores highest and lowest."""
    trainer = make(tiny_paths, prompts_dataset, rl_algorithm=algorithm, num_generations=4, rollout_buffer_size=1,
                   train_batch_size=4, agent_learning_rate=2e-3, temperature=1.0, top_p=1.0, top_k=None)
    learned_prefers_length(trainer)
    seen = capture_samples(trainer)
    frozen = [type(p.model)(p.model.config) for p in trainer.policies]
    for f, p in zip(frozen, trainer.policies):
        f.load_state_dict(p.model.state_dict())
    trainer.run.step.train_step([prompts_dataset[0]])
    (p0, out0), (p1, out1) = seen[:2]
    prompts = [trainer.formatters[i](prompts_dataset[0]) for i in range(2)]
    scores = trainer.learned_reward.score([out0.texts, out1.texts], prompts, {})
    best, worst = max(range(4), key=lambda j: scores[j]), min(range(4), key=lambda j: scores[j])
    assert scores[best] > scores[worst]
    for policy, out, old in ((p0, out0, frozen[0]), (p1, out1, frozen[1])):
        after = sequence_logps(policy, out)
        before = sequence_logps(type(policy)(0, old, policy.tokenizer, policy.device), out)
        assert float((after[best] - after[worst]) - (before[best] - before[worst])) > 0


def test_evaluation_uses_the_task_reward(tiny_paths, prompts_dataset):
    calls = []

    def task(c1, c2):
        calls.append(len(c1))
        return length_ratio(c1, c2)

    trainer = make(tiny_paths, prompts_dataset, reward=task, eval_num_samples=2)
    trainer.eval_dataset = prompts_dataset
    trainer.reward_learning.scorer.score_texts = lambda *a, **k: pytest.fail("evaluation must not use the learned reward")
    before = len(calls)
    metrics = trainer.evaluate()
    assert len(calls) > before and "eval/turn_1/reward_mean" in metrics


def test_reward_model_entity_rules(tiny_paths, prompts_dataset):
    model = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(tiny_paths["llama"]).config)
    model.config._name_or_path = ""
    other = AutoModelForCausalLM.from_config(model.config)
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    with pytest.raises(ValueError, match="reward_model_name must be provided"):
        MARLHFTrainer(agents=[model, other], tokenizer=tok, reward_func=length_ratio, args=MARLHFConfig(**BASE))
    trainer = MARLHFTrainer(agents=[model, other], tokenizer=tok, reward_func=length_ratio,
                            args=MARLHFConfig(**{**BASE, "reward_model_name": tiny_paths["gpt2"]}))
    assert trainer.reward_tokenizer.vocab_size != tok.vocab_size  # the reward model's own tokenizer
    with pytest.raises(ValueError, match="critic_model_name must be provided"):
        MARLHFTrainer(agents=[model, other], tokenizer=tok, reward_func=length_ratio,
                      args=MARLHFConfig(**{**BASE, "reward_model_name": tiny_paths["gpt2"], "rl_algorithm": "maac"}))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_default_reward_device_falls_back_with_one_warning(tiny_paths, prompts_dataset):
    with pytest.warns(UserWarning, match="not available on this host") as caught:
        trainer = make(tiny_paths, prompts_dataset, reward_model_device="cuda:0")
    assert trainer.reward_device == trainer.agent_devices[0]
    assert len([w for w in caught if "not available" in str(w.message)]) == 1


def test_frozen_backbone_trains_only_the_head(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, reward_freeze_backbone=True)
    backbone, head = snapshot(trainer.reward_model.backbone), snapshot(trainer.reward_model.reward_head)
    trainer.train()
    assert not changed(trainer.reward_model.backbone, backbone) and changed(trainer.reward_model.reward_head, head)


def test_save_model_exports_the_reward_model_and_it_loads_back(tiny_paths, prompts_dataset, tmp_path):
    trainer = make(tiny_paths, prompts_dataset)
    trainer.train()
    out = str(tmp_path / "export")
    trainer.save_model(out)
    assert sorted(os.listdir(out)) == ["agent_0", "agent_1", "reward_model"]
    again = make(tiny_paths, prompts_dataset, reward_model_name=os.path.join(out, "reward_model"))
    texts = ["Joint multi-agent response\n\nAgent 1 prompt:\nx"]
    # the same float32 weights read back and the same forward on the same text: the same numbers
    assert again.reward_learning.scorer.score_texts(texts) == trainer.reward_learning.scorer.score_texts(texts)
    with pytest.raises(FileExistsError):
        trainer.save_model(out)


def test_actor_critic_engine_shares_agents_and_keeps_one_optimizer_per_agent(tiny_paths, prompts_dataset):
    trainer = make(tiny_paths, prompts_dataset, rl_algorithm="iac", use_separate_critic=False)
    engine = trainer.run.step  # the actor-critic step, over actors that wrap the trainer's own models
    assert [a.model for a in engine.team.agents] == trainer.agents  # the same model objects
    assert trainer.optimizers == engine.team.optimizers and trainer.critics == []
    assert all(a.value_head is not None for a in engine.team.agents)
