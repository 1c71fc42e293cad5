"""Shared pieces of the preference trainer tests: small runs and what two equivalent runs agree on."""

from __future__ import annotations

import os

from tests.helpers.checkpoint_runs import run_summary
from tests.helpers.common import length_ratio

import comlrl.trainers.preference as preference

# Tiny runs with everything a checkpoint must carry: several collection steps, pairs, reward learning,
# evaluation rows, a logging gate holding pending sums across steps.
COMMON = dict(
    preference_num_candidates=3, preference_pairs_per_sample=2, max_new_tokens=5, verbose=False, agent_learning_rate=2e-3,
    weight_decay=0.0, eval_interval=3, eval_num_samples=1, logging_steps=3, collection_batch_size=2,
)
MARLHF = dict(COMMON, num_generations=2, reward_model_device=None, reward_learning_rate=1e-3, reward_train_batch_size=2)

TRAINERS = {
    "madpo": ("MADPOTrainer", "MADPOConfig", dict(COMMON, num_train_epochs=2, train_batch_size=2)),
    "marlhf-magrpo": ("MARLHFTrainer", "MARLHFConfig", dict(MARLHF, num_train_epochs=2, reference_kl_enabled=True)),
    "marlhf-iac": ("MARLHFTrainer", "MARLHFConfig", dict(MARLHF, num_train_epochs=1, rl_algorithm="iac", rollout_buffer_size=4)),
    "marlhf-maac": ("MARLHFTrainer", "MARLHFConfig", dict(MARLHF, num_train_epochs=1, rl_algorithm="maac", rollout_buffer_size=4)),
    "madpo-iter": ("MADPOIterTrainer", "MADPOIterConfig", dict(COMMON, num_iterations=2, comparator_policy="history",
                                                            preference_replay_mode="all_history")),
    "marlhf-iter": ("MARLHFIterTrainer", "MARLHFIterConfig", dict(MARLHF, num_iterations=2, num_train_epochs=1, reward_num_train_epochs=1,
                                                               comparator_policy="current", preference_scoring_reward="reward_model",
                                                               preference_replay_mode="lambda_decay", preference_replay_lambda=0.5)),
}


def make_preference(kind, paths, dataset, tmp_root=None, **overrides):
    cls_name, config_name, args = TRAINERS[kind]
    cls, config_cls = getattr(preference, cls_name), getattr(preference, config_name)
    args = dict(args, **overrides)
    if tmp_root is not None and "iter" in kind:
        args.setdefault("preference_replay_dir", os.path.join(tmp_root, "replay"))
    return cls(agents=[paths["llama"], paths["gpt2"]], reward_func=length_ratio, train_dataset=dataset, eval_dataset=dataset,
               args=config_cls(**args))


def preference_summary(trainer) -> dict:
    summary = run_summary(trainer)
    if getattr(trainer, "reward_model", None) is not None:
        summary["reward_model"] = [p.detach().clone() for p in trainer.reward_model.parameters()]
    critics = getattr(trainer, "critics", None) or []
    summary["critics"] = [p.detach().clone() for c in critics for p in c.parameters()]
    summary["pairs"] = [(p.winner_completions, p.loser_completions, p.winner_reward) for p in trainer.preference_pairs]
    summary["progress"] = vars(trainer.progress).copy()
    return summary
