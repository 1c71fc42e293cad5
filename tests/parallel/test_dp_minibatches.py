"""Data parallelism with minibatches smaller than the rollout buffer (issue 20, point 9): one global
permutation of the whole buffer, each rank training on its share of every global minibatch, so 2
processes equal 1 for every buffer/batch ratio (MAGRPO and IAC); and the comparator's own random
stream."""

import pytest
import torch
from tests.helpers.combination_scenarios import SCENARIOS
from tests.helpers.dp_scenarios import seed_everything
from tests.parallel.test_data_parallel import assert_close_runs, one_untrained, torchrun


@pytest.mark.slow
@pytest.mark.parametrize("scenario,models", [("magrpo_small_batch", "magrpo"), ("magrpo_batch_scale", "magrpo"), ("iac_small_batch", "iac")])
def test_two_ranks_equal_one_process_with_minibatches_smaller_than_the_buffer(tiny_paths, tmp_path, scenario, models):
    seed_everything(0)
    single = SCENARIOS[scenario](tiny_paths, str(tmp_path / "single"))
    (tmp_path / "double").mkdir()
    double = torchrun(scenario, tiny_paths, tmp_path / "double", module="tests.helpers.combination_scenarios")
    assert any(not torch.equal(a, b) for a, b in zip(single["parameters"], one_untrained(tiny_paths, models)))
    assert_close_runs(single, double)


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
