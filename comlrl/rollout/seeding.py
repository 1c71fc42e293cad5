"""Seeding the global random streams of a run (Python's ``random``, NumPy, torch).

The sampler draws from per-row generators of its own (``comlrl.rollout.sampling``); what is seeded
here is everything else: model initialisation (value heads), dataset shuffles, dropout.
"""

from __future__ import annotations

import random


def seed_everything(seed: int) -> None:
    """Seed ``random``, NumPy and torch (every device) with ``seed``, any integer Python accepts.

    NumPy takes only seeds in ``[0, 2**32)``, so it gets ``seed % 2**32`` (the same value for the
    usual seeds; a negative or very large ``seed``, such as one drawn by ``comlrl train``, still works).
    """
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
