"""The checkpoint tests' shared run: the 4-item dataset and the uninterrupted MAGRPO run every resumed
run is compared with (tests/helpers/checkpoint_runs.py)."""

import pytest
from tests.helpers.checkpoint_runs import make_dataset, make_magrpo, run_summary, seed_everything


@pytest.fixture(scope="module")
def dataset():
    return make_dataset(4)


@pytest.fixture(scope="module")
def straight(tiny_paths, dataset):
    """The uninterrupted run: 2 epochs of 4 steps, no checkpoints."""
    seed_everything(0)
    trainer = make_magrpo(tiny_paths, dataset)
    trainer.train()
    return run_summary(trainer)
