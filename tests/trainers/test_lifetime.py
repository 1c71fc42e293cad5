"""A trainer's models, optimizer states and frozen copies go as soon as the trainer does.

No part of a trainer holds it, and no reference cycle passes through its parts (``Trainer``'s
"Lifetime", ``run.owner_view``), so ``del trainer`` frees everything by reference counting alone: the
test runs with Python's cycle collector off, which a run's large tensors would not prompt anyway.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from tests.helpers.common import length_ratio
from tests.helpers.preference_runs import make_preference

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

SMALL = dict(num_turns=1, num_generations=2, max_new_tokens=3, num_train_epochs=1, verbose=False, eval_num_samples=1)


def dataset():
    return Dataset.from_dict({"prompt": ["Describe a city.", "Tell a joke."]})


def build(kind, paths, tmp_path):
    data = dataset()
    if kind == "magrpo-reference":
        return MAGRPOTrainer(agent_model=paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=data, eval_dataset=data,
                             args=MAGRPOConfig(**SMALL, reference_kl_enabled=True, output_dir=str(tmp_path / "out"), logging_steps=1))
    if kind == "magrpo-lora-mp":
        lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        return MAGRPOTrainer(agent_model=paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=data, peft_config=lora,
                             args=MAGRPOConfig(**SMALL, parallel_training="mp", agent_devices=["cpu", "cpu"]))
    if kind == "iac":
        return IACTrainer(agent_model=paths["llama"], critic_model=paths["llama"], reward_func=length_ratio, train_dataset=data,
                          eval_dataset=data, args=IACConfig(**SMALL, rollout_buffer_size=2))
    if kind == "maac":
        return MAACTrainer(agents=[paths["llama"], paths["gpt2"]], tokenizer=[paths["llama"], paths["gpt2"]], critic_model=paths["llama"], reward_func=length_ratio,
                           train_dataset=data, eval_dataset=data, args=MAACConfig(**SMALL, rollout_buffer_size=2))
    return make_preference(kind, paths, data, tmp_root=str(tmp_path))


def heavy_parts(trainer):
    """Weak references to everything large a trainer holds: agents, references, critics, the reward
    model, the iterative comparator's frozen copies, and every optimizer."""
    modules = list(trainer.agents) + [m for m in trainer.team.reference_models if m is not None]
    modules += list(getattr(trainer, "critics", None) or [])
    if getattr(trainer, "reward_model", None) is not None:
        modules.append(trainer.reward_model)
    comparator = getattr(getattr(trainer, "rounds", None), "comparator", None)
    if comparator is not None:
        modules += [m for m in (getattr(comparator, "copies", None) or []) if m is not None]
    optimizers = [o for o in trainer.optimizers if o is not None]
    assert modules and optimizers
    return [weakref.ref(x) for x in modules + optimizers]


@pytest.mark.filterwarnings("ignore::comlrl.telemetry.signal.NoLearningSignalWarning")  # two-item runs may tie
@pytest.mark.parametrize("kind", ["magrpo-reference", "magrpo-lora-mp", "iac", "maac", "madpo", "marlhf-magrpo", "marlhf-iac", "madpo-iter", "marlhf-iter"])
def test_del_trainer_frees_its_models_without_the_cycle_collector(kind, tiny_paths, tmp_path):
    torch.set_num_threads(1)
    trainer = build(kind, tiny_paths, tmp_path)
    trainer.train()
    trainer.evaluate()
    parts = heavy_parts(trainer)
    kept = weakref.ref(trainer)
    gc.collect()
    gc.disable()
    try:
        del trainer
        assert kept() is None, "something still holds the trainer"
        alive = [type(ref()).__name__ for ref in parts if ref() is not None]
        assert not alive, f"{kind}: still alive after del trainer: {alive}"
    finally:
        gc.enable()



def test_a_with_block_closes_the_trainer_however_it_ends(tiny_paths, tmp_path):
    """``with XTrainer(...) as trainer:`` closes the log file and stops the agent workers when the block
    ends, also when it raises (the error passes through); closing again changes nothing."""
    from comlrl.telemetry.metrics import JsonlSink

    def make(out):
        return MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=dataset(),
                             args=MAGRPOConfig(**SMALL, output_dir=str(out), parallel_training="mp", agent_devices=["cpu", "cpu"]))

    def log_file(trainer):
        (sink,) = [s for s in trainer.run.reporting.metrics.sinks if isinstance(s, JsonlSink)]
        return sink._file

    with make(tmp_path / "a") as trainer:
        trainer.train()
        assert not log_file(trainer).closed and trainer.team.workers._finalizer.alive
    assert log_file(trainer).closed and not trainer.team.workers._finalizer.alive
    assert (tmp_path / "a" / "metrics.jsonl").read_text().strip()
    trainer.close()

    with pytest.raises(KeyError, match="stopped inside the block"):
        with make(tmp_path / "b") as failing:
            failing.train()
            raise KeyError("stopped inside the block")
    assert log_file(failing).closed and not failing.team.workers._finalizer.alive


@pytest.mark.filterwarnings("ignore::comlrl.telemetry.signal.NoLearningSignalWarning")
def test_eval_row_hooks_bound_to_a_trainer_do_not_keep_it(tiny_paths, tmp_path):
    """``comlrl train``'s evaluation rows: the trainer holds the hooks and the hooks stamp its env_step,
    so they hold it weakly; rows still carry the step, and ``del trainer`` frees it, collector off."""
    import json

    from comlrl.telemetry.eval_rows import EvalRows

    path = tmp_path / "eval_rows.jsonl"
    rows = EvalRows(str(path), lambda *completions, batch_items: [{"chars": float(len(completions[0][0]))}])
    trainer = MAGRPOTrainer(agent_model=tiny_paths["llama"], num_agents=2, reward_func=length_ratio, train_dataset=dataset(),
                            eval_dataset=dataset(), eval_logger=rows.eval_logger, eval_aggregator=rows.eval_aggregator,
                            args=MAGRPOConfig(**SMALL))
    rows.bind(trainer)
    trainer.train()
    metrics = trainer.evaluate()
    assert "eval/chars" in metrics
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert written and written[-1]["env_step"] == trainer.env_step > 0  # the evaluation after training
    agent = weakref.ref(trainer.agents[0])
    gc.collect()
    gc.disable()
    try:
        del trainer
        assert agent() is None
    finally:
        gc.enable()
