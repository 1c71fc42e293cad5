"""Fixtures of every test: tiny models saved to a session directory (and tiny chat models like the
task repositories' ones), a fixed seed for every test, no W&B run outliving its test, and per-test
time limits (pytest-timeout). Plain helpers live in ``tests.helpers``."""

from __future__ import annotations

import os
import resource
import sys

import pytest
import torch

from tests.helpers.common import TEST_SEED, find_smollm2_wheel, prompt_dataset, seed_all
from tests.helpers.tiny_chat_models import build_chat_models

from tests.helpers.tiny_models import build_tiny_models  # noqa: E402

# Time limits (seconds) of pytest-timeout: the default comes from pyproject.toml; these are for the
# tests marked slow or network that do not name their own.
SLOW_TIMEOUT = 900
NETWORK_TIMEOUT = 600

# The tests marked ``numerics``: they compare floats under a tolerance derived from the computation
# (tests/helpers/tolerances.py) or rely on sampled outcomes, so a tolerance that only holds for one
# machine's float order, one thread count or one seed would show in them. ``.ci/run`` runs them again
# under more seeds, 2 torch threads and AVX2 kernels (docs/testing.md, "Numerics"). Node-id prefixes.
NUMERICS = (
    "tests/tools/test_numerics_settings.py",
    "tests/core/",
    "tests/rollout/test_scoring.py",
    "tests/rollout/test_generation_isolation.py",
    "tests/rollout/test_trees.py",
    "tests/rollout/test_vllm_backend.py::test_trainer_records_its_own_logprobs_not_the_engines",
    "tests/rollout/test_vllm_logprobs.py",
    "tests/trainers/test_kl_and_critic_settings.py",
    "tests/trainers/test_kl_loss.py",
    "tests/trainers/test_optimisation_mechanisms.py",
    "tests/trainers/reinforce/test_direction.py",
    "tests/trainers/reinforce/test_variant_config.py::test_multi_agent_diagnostics_are_logged",
    "tests/trainers/reinforce/test_magrpo_training.py::test_micro_batches_and_optimizer_schedules_give_the_same_update",
    "tests/trainers/actor_critic/test_direction.py",
    "tests/trainers/actor_critic/test_multiturn.py",
    "tests/trainers/actor_critic/test_q_critic_groups.py",
    "tests/trainers/actor_critic/test_training.py::test_value_from_the_actor_forward_equals_the_rollout_value",
    "tests/trainers/actor_critic/test_training.py::test_micro_batches_give_the_gradients_of_the_whole_minibatch",
    "tests/trainers/preference/test_madpo.py::test_joint_and_micro_batched_updates_agree",
    "tests/trainers/preference/test_madpo.py::test_a_step_raises_every_agents_winner_margin",
    "tests/models/test_gradient_checkpointing.py",
    "tests/models/test_reward_model.py::test_left_and_right_padding_give_the_same_score",
    "tests/telemetry/test_eval_logging.py::test_reference_kl_is_zero_before_any_update_and_positive_after",
    "tests/utils/test_compat_faces.py::test_reference_kl_for_sequence_zero_for_identical_and_positive_after_a_change",
)


def pytest_report_header(config):
    return (f"comlrl: every test is seeded with {TEST_SEED} (set COMLRL_TEST_SEED to change it); "
            f"torch runs {torch.get_num_threads()} thread(s) (COMLRL_TEST_THREADS), {torch.backends.cpu.get_cpu_capability()} kernels")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(NUMERICS):
            item.add_marker(pytest.mark.numerics)
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("network") is not None:
            item.add_marker(pytest.mark.timeout(NETWORK_TIMEOUT))
        elif item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def pytest_runtest_logfinish(nodeid, location):
    """With ``COMLRL_TEST_RSS_LOG=<file>``: one line per test with the process's resident memory now
    and its peak so far (MB), to find the test that makes the suite's memory jump (docs/testing.md)."""
    path = os.environ.get("COMLRL_TEST_RSS_LOG")
    if path:
        with open("/proc/self/status") as status:
            rss = next((int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:")), -1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        with open(path, "a") as log:
            log.write(f"{rss}\t{peak}\t{nodeid}\n")


@pytest.fixture(autouse=True)
def _seeded():
    """The same random streams at the start of every test, whatever ran before it."""
    seed_all(TEST_SEED)
    yield


@pytest.fixture(autouse=True)
def _environment_registry():
    """Environments a test registers (its own tasks, or `comlrl train --import MODULE` run in this
    process) leave with it: the registry is restored after every test, and a test helper module first
    imported by the test is forgotten with them, so that the next `--import` of it registers again."""
    from comlrl.envs import base

    saved, helpers = dict(base._REGISTRY), {name for name in sys.modules if name.startswith("tests.")}
    yield
    if base._REGISTRY != saved:
        base._REGISTRY.clear()
        base._REGISTRY.update(saved)
        for name in [name for name in sys.modules if name.startswith("tests.") and name not in helpers]:
            del sys.modules[name]


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
