"""Data parallelism with minibatches smaller than the rollout buffer (issue 20, point 9): one global
permutation of the whole buffer, each rank training on its share of every global minibatch, so 2
processes equal 1 for every buffer/batch ratio; the actor-critic trainers, whose minibatches are
still per process, refuse the ratio instead."""

import pytest
import torch
from combination_scenarios import SCENARIOS
from dp_scenarios import seed_everything
from test_data_parallel import assert_close_runs, one_untrained, pretend_two_ranks, torchrun

from comlrl.trainers.actor_critic import IACConfig, IACTrainer
from conftest import prompt_dataset


@pytest.mark.slow
def test_two_ranks_equal_one_process_with_minibatches_smaller_than_the_buffer(tiny_paths, tmp_path):
    seed_everything(0)
    single = SCENARIOS["magrpo_small_batch"](tiny_paths, str(tmp_path / "single"))
    (tmp_path / "double").mkdir()
    double = torchrun("magrpo_small_batch", tiny_paths, tmp_path / "double", module="combination_scenarios")
    assert any(not torch.equal(a, b) for a, b in zip(single["parameters"], one_untrained(tiny_paths, "magrpo")))
    assert_close_runs(single, double)


def test_actor_critic_refuses_per_process_minibatches(tiny_paths):
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=lambda a, b: [0.0] * len(a), train_dataset=prompt_dataset(4),
                         args=IACConfig(num_turns=1, rollout_buffer_size=4, train_batch_size=2, max_new_tokens=2, verbose=False,
                                        eval_interval=0, use_separate_critic=False))
    with pytest.raises(ValueError, match=r"train_batch_size == rollout_buffer_size .* Set train_batch_size=4"):
        pretend_two_ranks(trainer).train()
    assert trainer.env_step == 0


def test_the_comparator_samples_from_its_own_stream_on_cuda_too():
    """The comparator's row seeds come from its own stream whatever the generator's device: the
    trainer's global RNG is untouched (before, on CUDA only the CUDA state was swapped, while the row
    seeds were drawn from the trainer's CPU generator)."""
    from types import SimpleNamespace

    from comlrl.rollout.generation import SamplingParams
    from comlrl.rollout.sampling import draw_seeds
    from comlrl.trainers.preference.comparators import Comparator, RngStreams

    seen = []

    def generate(prompts, count, sampling, seeds=None):
        seen.append(list(seeds) if seeds is not None else draw_seeds(len(prompts) * count))

    comparator = object.__new__(Comparator)
    comparator.streams = RngStreams(7)
    generator = SimpleNamespace(device=torch.device("cuda", 0), generate=generate)
    before = torch.get_rng_state()
    comparator._sample(generator, ["a", "b"], 2, SamplingParams(3))
    comparator._sample(generator, ["a", "b"], 2, SamplingParams(3))
    assert torch.equal(torch.get_rng_state(), before)
    again = RngStreams(7)
    with again.active(torch.device("cpu")):
        expected = [draw_seeds(4), draw_seeds(4)]
    assert seen == expected
