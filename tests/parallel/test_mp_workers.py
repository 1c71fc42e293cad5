"""parallel_training="mp": each agent generates and updates on its own worker thread, concurrently,
and the run ends bit-identical to the sequential one (per-row random streams, results in agent order)."""

import threading

import pytest
import torch
from tests.helpers.checkpoint_runs import assert_same_run, make_dataset, make_magrpo, run_summary, seed_everything
from tests.helpers.common import length_ratio

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

AC = dict(num_turns=2, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=6,
          train_batch_size=3, agent_learning_rate=1e-3, critic_learning_rate=1e-3, early_termination_threshold=None,
          eval_interval=0, update_epochs=2, logging_steps=1)


def transition(prompt, agent_completions, **_):
    return [f"{prompt} again: {c[:8]}" for c in agent_completions]


def run_magrpo(paths, parallel):
    seed_everything(0)
    extra = dict(parallel_training="mp", agent_devices=["cpu", "cpu"]) if parallel else {}
    trainer = make_magrpo(paths, make_dataset(4), train_batch_size=1, **extra)
    trainer.train()
    return trainer


def run_ac(paths, cls, config_cls, parallel, **config):
    seed_everything(0)
    extra = dict(parallel_training="mp", agent_devices=["cpu", "cpu"], critic_devices=["cpu"] if cls is MAACTrainer else ["cpu", "cpu"]) if parallel else {}
    if cls is IACTrainer and not config.get("use_separate_critic", True):
        extra.pop("critic_devices", None)
    critic = {} if config.get("use_separate_critic", True) is False else {"critic_model": paths["llama"]}
    trainer = cls(agent_model=paths["llama"], reward_func=length_ratio, external_transition=transition,
                  train_dataset=make_dataset(4), args=config_cls(**{**AC, **config, **extra}), **critic)
    trainer.train()
    return trainer


def ac_summary(trainer):
    summary = run_summary(trainer)
    summary["optimizers"] = [opt.state_dict() for opt in trainer.named_optimizers().values()]  # critics' too
    summary["critics"] = [p.detach().clone() for c in trainer.critics for p in c.parameters()]
    return summary


def test_magrpo_mp_is_bit_identical_to_sequential(tiny_paths):
    sequential = run_magrpo(tiny_paths, parallel=False)
    parallel = run_magrpo(tiny_paths, parallel=True)
    assert parallel.team.workers.parallel and not sequential.team.workers.parallel
    assert_same_run(run_summary(sequential), run_summary(parallel))


@pytest.mark.parametrize("cls, config_cls, config", [
    (IACTrainer, IACConfig, {}),
    (IACTrainer, IACConfig, {"use_separate_critic": False}),
    (MAACTrainer, MAACConfig, {"critic_type": "q"}),
])
def test_actor_critic_mp_is_bit_identical_to_sequential(tiny_paths, cls, config_cls, config):
    sequential = run_ac(tiny_paths, cls, config_cls, False, **config)
    parallel = run_ac(tiny_paths, cls, config_cls, True, **config)
    assert_same_run(ac_summary(sequential), ac_summary(parallel))


def test_mp_agents_generate_and_update_at_the_same_time(tiny_paths):
    """Both agents' generate calls (and their backward passes) are inside each other's span: a barrier
    that both must reach before either may continue would time out if they ran one after the other."""
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, make_dataset(2), parallel_training="mp", agent_devices=["cpu", "cpu"],
                          num_turns=1, num_train_epochs=1, eval_interval=0, reference_kl_enabled=False)
    barrier = threading.Barrier(2, timeout=20)
    threads = []
    for agent in trainer.agents:
        original = agent.generate

        def generate(*args, _original=original, **kwargs):
            threads.append(threading.current_thread().name)
            barrier.wait()
            return _original(*args, **kwargs)

        agent.generate = generate
    trainer.train()
    assert len(set(threads)) == 2 and all(name.startswith("comlrl-agent") for name in threads)
    trainer.close()
