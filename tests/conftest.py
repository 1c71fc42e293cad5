"""Fixtures of every test: tiny models saved to a session directory (and tiny chat models like the
task repositories' ones), a fixed seed for every test, no W&B run outliving its test, and per-test
time limits (pytest-timeout). Plain helpers live in ``tests.helpers``."""

from __future__ import annotations

import sys

import pytest

from tests.helpers.common import TEST_SEED, find_smollm2_wheel, prompt_dataset, seed_all
from tests.helpers.tiny_chat_models import build_chat_models

from tests.helpers.tiny_models import build_tiny_models  # noqa: E402

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


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    """``{"llama": dir, "gpt2": dir}``: two tiny models with different tokenizers."""
    return build_tiny_models(str(tmp_path_factory.mktemp("tiny-models")))


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


@pytest.fixture(scope="session")
def vllm_paths(tmp_path_factory):
    """``{"llama": dir, "gpt2": dir}`` that vLLM can run (see tests/helpers/vllm_models.py)."""
    from tests.helpers.vllm_models import build_vllm_models

    return build_vllm_models(str(tmp_path_factory.mktemp("vllm-models")))


@pytest.fixture
def real_engines(monkeypatch):
    """For the tests of the real vLLM engine: a 1 GiB KV cache per engine (vLLM's CPU default reserves
    a fraction of the machine's memory), and every engine a test left behind shut down after it."""
    import gc

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    yield
    gc.collect()


@pytest.fixture
def prompts_dataset():
    return prompt_dataset(4)


@pytest.fixture(scope="session")
def chat_models(tmp_path_factory):
    """``{"qwen": dir, "llama": dir}`` (see tests/helpers/tiny_chat_models.py)."""
    return build_chat_models(str(tmp_path_factory.mktemp("chat-models")))
