"""Runs that test_fsdp.py starts in one process and under torchrun with 2 ranks, with ``fsdp=True``
(which only warns in one process, so both runs are the same script and config).

Parameters are read with every sharded tensor gathered (``full_tensor``: collective, so every rank
calls ``summary`` at the same point)."""

import os

from datasets import Dataset
from tests.helpers.direction import agent_steps
from tests.helpers.dp_scenarios import LR, PROMPTS, magrpo, reward, seed_everything

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from comlrl.parallel.fsdp import is_sharded, is_sharded_tensor


def full_parameters(models):
    return [(p.full_tensor() if is_sharded_tensor(p) else p).detach().clone() for m in models for p in m.parameters()]


def summary(trainer):
    rows = [dict(r) for r in trainer.log_history]
    return {
        "parameters": full_parameters(trainer.agents),
        "env_step": trainer.env_step,
        "rows": [r for r in rows if not any(k.startswith("eval/") for k in r)],
        "eval_rows": [r for r in rows if any(k.startswith("eval/") for k in r)],
        "sharded": [is_sharded(agent) for agent in trainer.agents],
        "steps": agent_steps(trainer),
    }


def fsdp_magrpo(paths, out, **overrides):
    """The data-parallel MAGRPO run (llama + gpt2, both with tied embeddings) with fsdp=True, the
    accumulate-clip-step schedule, two micro-batches per step, and an evaluation every 2 items."""
    trainer = magrpo(paths, out, fsdp=True, max_grad_norm=1.0, update_micro_batch_size=2, eval_interval=2, **overrides)
    trainer.eval_dataset = Dataset.from_dict({"prompt": PROMPTS[:2]})
    return trainer


def fsdp_iac(paths, epochs=1):
    """Shared-head IAC: a replicated value head on each sharded backbone, one AdamW over both."""
    args = IACConfig(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=epochs, verbose=False,
                     rollout_buffer_size=4, agent_learning_rate=LR, eval_interval=0, weight_decay=0.0, logging_steps=1,
                     use_separate_critic=False, fsdp=True, value_loss_coef=0.5)
    return IACTrainer(agent_model=paths["llama"], reward_func=reward, args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS}))


def run_fsdp_train(paths, out):
    """MAGRPO and shared-head IAC trained, then exported with save_model."""
    trainer = fsdp_magrpo(paths, out)
    trainer.train()
    trainer.save_model(os.path.join(out, "magrpo-export"))
    result = {"magrpo": summary(trainer)}
    seed_everything(0)
    iac = fsdp_iac(paths)
    iac.train()
    iac.save_model(os.path.join(out, "iac-export"))
    result["iac"] = summary(iac)  # the value heads' parameters included
    return result


def checkpointed(make, directory):
    """A checkpoint after every step, then a fresh trainer resumed from the one after step 1, trained
    to the end: the straight and the resumed run's summaries."""
    first = make()
    first.train(checkpoint_dir=directory, checkpoint_steps=1)
    seed_everything(123)  # anything: the checkpoint's RNG states replace it
    resumed = make()
    resumed.train(resume_from_checkpoint=os.path.join(directory, "checkpoint-step-1"))
    return {"straight": summary(first), "resumed": summary(resumed)}


def run_fsdp_checkpointed(paths, out):
    """MAGRPO with reference KL (unsharded frozen references; a multi-turn leftover in the buffers at
    step 1) and shared-head IAC (Adam moments of shards and of the replicated head in one optimizer)."""
    directory = os.path.join(out, "ckpts")
    result = checkpointed(lambda: fsdp_magrpo(paths, out, output_dir=None, reference_kl_enabled=True), directory)
    result["names"] = sorted(os.listdir(directory))
    seed_everything(0)
    result["iac"] = checkpointed(lambda: fsdp_iac(paths, epochs=2), os.path.join(out, "iac-ckpts"))
    return result


SCENARIOS = {"fsdp_train": run_fsdp_train, "fsdp_checkpointed": run_fsdp_checkpointed}
