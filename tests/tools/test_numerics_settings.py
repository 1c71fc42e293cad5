"""The settings the numerics runs of ``.ci/run`` vary really reach torch in the test process."""

import os

import torch
from tests.helpers.common import TEST_SEED, TEST_THREADS


def test_thread_count_seed_and_kernels_reach_torch():
    assert TEST_THREADS == int(os.environ.get("COMLRL_TEST_THREADS", "1"))
    assert torch.get_num_threads() == TEST_THREADS
    assert TEST_SEED == int(os.environ.get("COMLRL_TEST_SEED", "0"))
    assert torch.initial_seed() == TEST_SEED  # the autouse fixture seeded this test
    requested = os.environ.get("ATEN_CPU_CAPABILITY")
    if requested in ("avx2", "default"):  # what was asked, or the plain kernels on a CPU without it
        assert torch.backends.cpu.get_cpu_capability() in (requested.upper(), "DEFAULT")
