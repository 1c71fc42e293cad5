"""Gradient checkpointing (issue 12): the same gradients with dropout off, less saved activation memory."""

import copy

import torch
from tests.helpers.common import length_ratio
from tests.helpers.tiny_models import make_llama, make_tokenizer

from comlrl.models.gradient_checkpointing import enable_gradient_checkpointing, scoring_mode
from comlrl.rollout.batch import build_sequence_batch
from comlrl.rollout.scoring import score_completions
from comlrl.trainers.actor_critic import MAACConfig, MAACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def saved_activation_bytes(fn):
    """Bytes of every tensor autograd saves for backward while ``fn`` runs (parameters excluded)."""
    total = [0]
    params = set()

    def pack(tensor):
        if not isinstance(tensor, torch.nn.Parameter) and tensor.data_ptr() not in params:
            total[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(params)
    return out, total[0]


def loss_and_grads(model, batch):
    def run(params):
        params.update(p.data_ptr() for p in model.parameters())
        scoring_mode(model)
        return score_completions(model, batch, 0.7).logprobs.mul(batch.mask).sum()

    loss, saved = saved_activation_bytes(run)
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()], saved


def test_checkpointing_gives_the_same_gradients_with_less_saved_memory():
    tok = make_tokenizer(300, "<eos>", "<pad>")
    plain = make_llama(tok, hidden=64, layers=4)
    plain.config.attention_dropout = 0.5  # dropout would make any recompute differ: it must stay off
    for layer in plain.model.layers:
        layer.self_attn.attention_dropout = 0.5
    checkpointed = copy.deepcopy(plain)
    enable_gradient_checkpointing(checkpointed, "agents[0]")
    prompts = [torch.randint(3, 290, (n,)) for n in (12, 9, 15, 7)]
    completions = [torch.randint(3, 290, (n,)) for n in (20, 16, 24, 10)]
    batch = build_sequence_batch(prompts, completions, tok.pad_token_id, torch.device("cpu"))
    grads, saved = loss_and_grads(plain, batch)
    grads_ckpt, saved_ckpt = loss_and_grads(checkpointed, batch)
    for a, b in zip(grads, grads_ckpt):  # the recompute runs the same forward on the same numbers: the same bits
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert all(layer.self_attn.training is False for layer in checkpointed.model.layers)
    # four layers keep only their inputs: well under half of the activations stay saved
    assert saved_ckpt < 0.5 * saved, (saved_ckpt, saved)


def test_trainers_enable_checkpointing_and_train_identically(tiny_paths, prompts_dataset):
    def run(checkpointing):
        torch.manual_seed(0)
        trainer = MAGRPOTrainer(
            agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=prompts_dataset,
            args=MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False,
                              rollout_buffer_size=2, agent_learning_rate=1e-3, gradient_checkpointing=checkpointing),
        )
        trainer.train()
        return trainer

    plain, checkpointed = run(False), run(True)
    assert all(layer.gradient_checkpointing for layer in checkpointed.agents[0].model.layers)
    for a, b in zip(plain.agents, checkpointed.agents):  # the same gradients (above), so the same AdamW steps
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_critics_are_checkpointed_too(tiny_paths):
    trainer = MAACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
                          args=MAACConfig(num_turns=1, gradient_checkpointing=True))
    assert all(layer.gradient_checkpointing for layer in trainer.critics[0].model.model.layers)
