"""The feature combination matrix (issue 20, point 10): one tiny run per feature and per pair of
features, shared by ``test_combinations.py`` (one process) and ``combination_scenarios.py`` (the
pairs with 2-rank data parallelism, all in one torchrun launch).

Every feature is one value of one axis; a pair takes two values of different axes. Features whose
maths is the same as without them (``NEUTRAL``: the schedule or memory changes, not the update)
are checked against the run without them; ``docs/testing.md`` lists the matrix and the refusals.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from datasets import Dataset
from peft import LoraConfig
from tests.helpers.direction import agent_steps
from tests.helpers.tolerances import adamw_gap

PROMPTS = ["Describe a city", "Tell a joke", "Invent a fruit", "Write a story"]
LR = 1e-5

# axis -> feature -> (config fields, trainer keyword arguments)
AXES: Dict[str, Dict[str, Tuple[Dict[str, Any], Dict[str, Any]]]] = {
    "trainer": {"marlhf_magrpo": ({}, {}), "marlhf_iac": ({}, {}), "marlhf_maac": ({}, {}), "madpo": ({}, {})},
    "lora": {"lora": ({}, {"peft_config": "lora"})},
    "precision": {"bf16_mixed": ({"precision": "bf16-mixed"}, {})},
    "checkpointing": {"gradient_checkpointing": ({"gradient_checkpointing": True}, {})},
    "threads": {"mp": ({"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]}, {})},
    "micro": {"micro_batches": ({"update_micro_batch_size": 1}, {})},
    "kl": {"kl_loss": ({"reference_kl_enabled": True}, {}),
           "kl_reward": ({"reference_kl_enabled": True, "reference_kl_mode": "reward"}, {})},
    "ratio": {"batch_below_buffer": ({"train_batch_size": 2}, {})},
    "data_parallel": {"dp2": ({}, {})},
}
FEATURES = {name: axis for axis, values in AXES.items() for name in values}

# Features that must not change the maths, and how exactly (docs/testing.md): "bit" is bit-identical,
# "close" allclose within tolerances.adamw_gap(lr, steps): AdamW turns float noise in a near-zero
# gradient into a step of up to lr (more after the first), in either direction.
NEUTRAL = {"mp": "bit", "gradient_checkpointing": "close", "micro_batches": "close", "dp2": "close"}

# Pairs refused before any model loads, with the message that says so.
REFUSED: Dict[frozenset, str] = {
    **{frozenset({t, "lora"}): r"peft_config is not supported by (MADPO|MARLHF)Trainer yet" for t in ("marlhf_magrpo", "marlhf_iac", "marlhf_maac", "madpo")},
    **{frozenset({t, "dp2"}): r"does not run under torchrun yet" for t in ("marlhf_magrpo", "marlhf_iac", "marlhf_maac", "madpo")},
    **{frozenset({"madpo", k}): r"reference_kl_enabled=True is not used by MADPO" for k in ("kl_loss", "kl_reward")},
    frozenset({"mp", "dp2"}): r"parallel_training='mp' .* cannot be combined with torchrun's data parallelism",
}


def pairs() -> List[Tuple[str, str]]:
    """Every pair of features of different axes, in a fixed order."""
    names = list(FEATURES)
    return [(a, b) for a, b in itertools.combinations(names, 2) if FEATURES[a] != FEATURES[b]]


def seed_everything(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def reward(c1, c2):
    return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(c1, c2)]


def _config(trainer: str, fields: Dict[str, Any]):
    from comlrl.trainers.preference import MADPOConfig, MARLHFConfig
    from comlrl.trainers.reinforce import MAGRPOConfig

    common = dict(num_turns=1, max_new_tokens=3, num_train_epochs=1, verbose=False, agent_learning_rate=LR, weight_decay=0.0,
                  eval_interval=0, logging_steps=1, early_termination_threshold=None)
    if trainer == "magrpo":
        return MAGRPOConfig(**{**common, "num_generations": 2, "rollout_buffer_size": 4, **fields})
    preference = dict(common, preference_num_candidates=3, preference_pairs_per_sample=2, collection_batch_size=2)
    if trainer == "madpo":
        return MADPOConfig(**{**preference, **fields})
    rl = trainer.removeprefix("marlhf_")
    extra = dict(num_generations=2, reward_model_device=None, reward_learning_rate=1e-3, rl_algorithm=rl, rollout_buffer_size=4)
    if rl != "magrpo" and fields.get("parallel_training") == "mp":
        extra["critic_devices"] = ["cpu"] if rl == "maac" else ["cpu", "cpu"]
    return MARLHFConfig(**{**preference, **extra, **fields})


def build(paths: Dict[str, str], features: Iterable[str]):
    """The trainer of one cell: MAGRPO unless a trainer feature is among ``features``."""
    from comlrl.trainers.preference import MADPOTrainer, MARLHFTrainer
    from comlrl.trainers.reinforce import MAGRPOTrainer

    features = list(features)
    trainer = next((f for f in features if FEATURES[f] == "trainer"), "magrpo")
    fields: Dict[str, Any] = {}
    kwargs: Dict[str, Any] = {}
    for feature in features:
        f, k = AXES[FEATURES[feature]][feature]
        fields.update(f)
        kwargs.update(k)
    if kwargs.get("peft_config") == "lora":
        kwargs["peft_config"] = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                           init_lora_weights=False)
    cls = {"magrpo": MAGRPOTrainer, "madpo": MADPOTrainer}.get(trainer, MARLHFTrainer)
    return cls(agents=[paths["llama"], paths["llama"]], reward_func=reward, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
               args=_config(trainer, fields), **kwargs)


def run(paths: Dict[str, str], features: Iterable[str]) -> Dict[str, Any]:
    """Train one cell from seed 0; its agents' trained tensors (adapters for LoRA) and logged rows."""
    seed_everything(0)
    trainer = build(paths, features)
    before = [p.detach().clone() for m in trainer.agents for p in m.parameters()]
    trainer.train()
    after = [p.detach().clone() for m in trainer.agents for p in m.parameters()]
    steps = agent_steps(trainer)
    close = getattr(trainer, "close", None)
    if callable(close):
        close()
    return {"before": before, "after": after, "rows": [dict(r) for r in trainer.log_history], "steps": steps}


def reference_of(pair: Tuple[str, ...]) -> Tuple[Tuple[str, ...], Optional[str]]:
    """The cell a pair must equal and how exactly: without its neutral features (None: no reference,
    the pair is checked to train finitely)."""
    neutral = [f for f in pair if f in NEUTRAL]
    if not neutral:
        return pair, None
    rest = tuple(f for f in pair if f not in NEUTRAL)
    exactness = "close" if any(NEUTRAL[f] == "close" for f in neutral) else "bit"
    return rest, exactness


def assert_same(got: Dict[str, Any], want: Dict[str, Any], exactness: str, label: str) -> None:
    assert len(got["after"]) == len(want["after"]), label
    for index, (a, b) in enumerate(zip(got["after"], want["after"])):
        if exactness == "bit":
            assert torch.equal(a, b), f"{label}: tensor {index} differs by {float((a - b).abs().max())}"
        else:
            gap = adamw_gap(LR, max(got["steps"], want["steps"]))
            torch.testing.assert_close(a, b, atol=gap, rtol=0, msg=lambda m: f"{label}: tensor {index}: {m}")


def assert_trained(result: Dict[str, Any], label: str) -> None:
    assert all(torch.isfinite(t).all() for t in result["after"]), label
    assert any(not torch.equal(a, b) for a, b in zip(result["before"], result["after"])), f"{label}: nothing moved"
