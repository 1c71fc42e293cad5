"""MADPO's pair scoring runs in the scoring mode of every other policy update (issue 20, point 5):
checkpointed layers recompute their activations in backward, and the forward runs under the
precision's autocast."""

import torch
from tests.helpers.common import length_ratio, seed_all

from comlrl.trainers.preference import MADPOConfig, MADPOTrainer

BASE = dict(num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=4,
            verbose=False, agent_learning_rate=1e-3, eval_interval=0, weight_decay=0.0, logging_steps=1)


def _layer_calls_with_grad(paths, dataset, **overrides):
    """Calls of agent 0's first attention block made with grad enabled (the update's forwards, and
    their recomputation in backward under gradient checkpointing), and the LM head's output dtypes."""
    seed_all(0)
    trainer = MADPOTrainer(agents=[paths["llama"], paths["llama"]], reward_func=length_ratio, train_dataset=dataset,
                           args=MADPOConfig(**{**BASE, **overrides}))
    model = trainer.agents[0]
    calls, dtypes = [], []
    attention = model.model.layers[0].self_attn
    forward = attention.forward

    def counted(*args, **kwargs):  # a wrapped forward sees the recomputation too (module hooks do not)
        if torch.is_grad_enabled():
            calls.append(1)
        return forward(*args, **kwargs)

    attention.forward = counted
    model.lm_head.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype) if torch.is_grad_enabled() else None)
    trainer.train()
    assert trainer.preference_pairs, "the run must have pairs to learn from"
    return len(calls), set(dtypes)


def test_gradient_checkpointing_recomputes_in_the_madpo_update(tiny_paths, prompts_dataset):
    plain, _ = _layer_calls_with_grad(tiny_paths, prompts_dataset)
    checkpointed, _ = _layer_calls_with_grad(tiny_paths, prompts_dataset, gradient_checkpointing=True)
    assert plain > 0 and checkpointed == 2 * plain  # every grad forward of the layer runs again in backward


def test_mixed_precision_autocasts_the_madpo_update(tiny_paths, prompts_dataset):
    _, dtypes = _layer_calls_with_grad(tiny_paths, prompts_dataset, precision="bf16-mixed")
    assert dtypes == {torch.bfloat16}
