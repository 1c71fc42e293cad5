"""Iterative preference trainers: ``num_iterations`` rounds of comparisons against a comparator.

Round r (1-based):
  1. collect   per batch of items: the current agents sample K candidates (one generate call per
               agent), the comparator (``comparators.Comparator``) samples K_c on its own RNG stream;
               both sides are scored (raw and processed rewards; one reward call per item and side)
               and candidate j of the policy meets candidate j of the comparator: the higher reward
               wins, ties give no pair (``comparison_pairs``)
  2. replay    the round's pairs go to ``preference_replay/iteration_000r.json`` and the replay
               buffer; the round trains on ``preference_replay_mode``'s selection
  3. learn     MADPOIter: ``num_train_epochs`` MADPO epochs; MARLHFIter: reward learning restarted
               from the initial reward model, then ``num_train_epochs`` of online RL
  4. files     ``policy_checkpoints/iteration_000r/`` (when ``policy_checkpoint_dir`` is set), the
               round's reward distribution (when ``log_reward_distribution``), ``iter/*`` metrics
A checkpoint is written after every round (and at the phase boundaries within it).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from comlrl.models.loading import check_model_config
from comlrl.models.reward_model import trainable_state
from comlrl.models.saving import save_pretrained_dir
from comlrl.rollout.rewards import RewardFunction, resolve_reward_range
from comlrl.trainers.preference.checkpointing import REPLAY_RECORDS, DictState, InitialRewardHead, replay_check
from comlrl.trainers.preference.collection import ItemCandidates, collect_candidates, comparison_pairs, score_candidates
from comlrl.trainers.preference.comparators import Comparator
from comlrl.trainers.preference.distributions import distribution_means, distribution_record, wandb_histograms, write_distribution_png
from comlrl.trainers.preference.iterative_config import MADPOIterConfig, MARLHFIterConfig
from comlrl.trainers.preference.madpo import MADPOTrainer, PreferencePair
from comlrl.trainers.preference.marlhf import MARLHFTrainer
from comlrl.trainers.preference.output_paths import OutputDirs
from comlrl.trainers.preference.replay import PreferenceReplay, write_json_new, write_shard
from comlrl.checkpoint import layout
from comlrl.checkpoint.state import AttributeState, CheckpointComponents

__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]


def _empty_round_values() -> Dict[str, Any]:
    return {"target": [], "comparator": [], "scoring": "task"}


class MADPOIterTrainer(MADPOTrainer):
    """Iterative MADPO (see the module docstring and ``MADPOIterConfig``); arguments as ``MADPOTrainer``."""

    default_config_cls = MADPOIterConfig
    config_family = MADPOIterConfig
    algorithm_name = "MADPOIter"

    def __init__(self, *args: Any, **kwargs: Any):
        given = self._madpo_arguments(args, kwargs)
        config, reward_func = self._resolve_args(given["args"]), given["reward_func"]
        self._distribution_range = None
        if config.log_reward_distribution:
            self._distribution_range = resolve_reward_range(reward_func) if reward_func is not None else None
            if self._distribution_range is None:
                raise ValueError(
                    "log_reward_distribution=True requires reward_func.reward_range (the histograms' range): declare it with "
                    "comlrl.utils.set_reward_range(reward_func, minimum, maximum)."
                )
        self._preference_model_config = check_model_config(given["model_config"])
        super().__init__(*args, **kwargs)
        a = self.args
        self.comparator = Comparator(self)
        self.replay = PreferenceReplay(a.preference_replay_mode, a.preference_replay_k, a.preference_replay_lambda, a.preference_replay_sample_size)
        self._round_values = _empty_round_values()
        self.outputs = OutputDirs(self.wandb_config, a.output_dir,
                                  {"preference_replay": a.preference_replay_dir, "policy_checkpoints": a.policy_checkpoint_dir})
        self._rewrite_shards = False

    def _wandb_run_config(self) -> Dict[str, Any]:
        a = self.args
        config = super()._wandb_run_config()
        config.update(num_iterations=a.num_iterations, comparator_policy=a.comparator_policy, comparator_generation_mode=a.comparator_generation_mode,
                      preference_replay_mode=a.preference_replay_mode)
        return config

    # ------------------------------------------------------------------ rounds
    def _num_rounds(self) -> int:
        return self.args.num_iterations

    def _run_epochs(self) -> None:
        p = self.progress
        if self._rewrite_shards:  # a resumed run: its own copies of the shards its checkpoint holds
            for shard in self.replay.shards:
                write_shard(self.outputs.path("preference_replay"), shard.iteration, shard.pairs)
            self._rewrite_shards = False
        if p.round == 0 and p.phase == "collect" and self.args.policy_checkpoint_dir:
            self._export_policy("initial")  # the agents are still the initial policy until round 1 learns
        super()._run_epochs()

    def _collection_phase(self) -> None:
        self.comparator.prepare_round()
        super()._collection_phase()

    def _comparison_reward(self) -> RewardFunction:
        """What scores this round's comparisons (MARLHFIter may use its learned reward)."""
        return self.reward

    def _collect_items(self, items: List[Any]) -> List[PreferencePair]:
        a = self.args
        sampling = self._sampling()
        target = collect_candidates(self.policies, self._item_prompts(items), items, a.preference_num_candidates, sampling,
                                    self._step_seed(), self._workers.map)
        comparator = self.comparator.candidates(target, a.comparator_num_candidates or a.preference_num_candidates, sampling)
        reward = self._comparison_reward()
        self._round_values["scoring"] = "task" if reward is self.reward else "reward_model"
        for side in (target, comparator):
            score_candidates(reward, side)
        pairs = [pair for t, c in zip(target, comparator) for pair in comparison_pairs(self.policies, t, c, a.pair_selection, a.preference_pairs_per_sample)]
        self._record_comparisons(target, comparator, len(pairs))
        return pairs

    def _record_comparisons(self, target: List[ItemCandidates], comparator: List[ItemCandidates], pairs: int) -> None:
        self._round_values["target"].extend(v for c in target for v in c.raw_rewards.tolist())
        self._round_values["comparator"].extend(v for c in comparator for v in c.raw_rewards.tolist())
        self._record_collection(target, pairs)
        wins = sum(int((t.rewards[: c.count] > c.rewards[: t.count]).sum()) for t, c in zip(target, comparator))
        compared = sum(min(t.count, c.count) for t, c in zip(target, comparator))
        self.metrics.record({"collect/comparator_reward_mean": float(sum(float(c.rewards.mean()) for c in comparator) / len(comparator)),
                             "collect/win_rate": wins / max(compared, 1)})

    def _training_pairs(self, round_pairs: List[PreferencePair]) -> List[PreferencePair]:
        r = self.progress.round + 1
        write_shard(self.outputs.path("preference_replay"), r, round_pairs)
        self.replay.add(r, round_pairs)
        self.comparator.after_collection(self.progress.round)
        return self.replay.select(round_pairs)

    def _phase_checkpoint_name(self, phase: str, epoch: Optional[int] = None) -> str:
        """``checkpoint-round-<R>-collected``, ``-reward-model``, ``-epoch-<E>`` for round R in progress."""
        return layout.phase_checkpoint_name(phase, self.progress.round + 1, epoch)

    def _checkpoint_after_epoch(self, epoch: int, final: bool) -> None:
        schedule = self._checkpoint_schedule
        # a round's last epoch is followed by the round's own checkpoint
        if not final and schedule is not None and schedule.due_after_epoch(epoch, final):
            self._checkpoint_save_to_directory(schedule, self._phase_checkpoint_name("", epoch))

    def _end_round(self) -> bool:
        p = self.progress
        r = p.round + 1
        if self.args.policy_checkpoint_dir:
            self._export_policy(f"iteration_{r:04d}")
        self._log_round(r)
        self._round_values, self._round_pairs, self._epoch_order = _empty_round_values(), [], None
        p.round, p.phase = r, "collect"
        self.state.epoch = self.state.position = 0
        self._checkpoint_commit(layout.phase_checkpoint_name("", r))  # checkpoint-round-<r>
        return True

    # ------------------------------------------------------------------ files and metrics of a round
    def _export_policy(self, label: str) -> None:
        root = os.path.join(self.outputs.path("policy_checkpoints"), label)
        for target, model, tokenizer in zip(self._agent_export_dirs(root), self.agents, self.tokenizers):
            save_pretrained_dir(target, self._export_model(model), tokenizer)

    def _log_round(self, r: int) -> None:
        row = {
            "iter/current_iteration": float(r), "iter/current_preference_pairs": float(len(self._round_pairs)),
            "iter/total_preference_pairs": float(self.replay.total_pairs), "iter/train_preference_pairs": float(len(self.preference_pairs)),
        }
        if self.args.log_reward_distribution:
            record = self._distribution(r)
            directory = self.outputs.path("reward_distributions")
            write_json_new(os.path.join(directory, f"iteration_{r:04d}.json"), record)
            write_distribution_png(os.path.join(directory, f"iteration_{r:04d}.png"), record)
            row.update(distribution_means(record))
            if self._wandb is not None:
                self._wandb.run.log(wandb_histograms(record), step=self.env_step)
        self.metrics.write(row, self.env_step)

    def _distribution(self, r: int) -> Dict[str, Any]:
        values = self._round_values
        selected = [(p.target_raw_reward, p.comparator_raw_reward) for p in self.preference_pairs]
        series = {
            ("candidate", "target"): values["target"], ("candidate", "comparator"): values["comparator"],
            ("selected", "target"): [t for t, _ in selected if t is not None],
            ("selected", "comparator"): [c for _, c in selected if c is not None],
        }
        reward_range = self._distribution_range if values["scoring"] == "task" else None  # learned scores: their own range
        return distribution_record(r, series, reward_range)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_components(self) -> CheckpointComponents:
        components = super()._checkpoint_components()
        for name, models in self.comparator.models().items():
            components.add_models(name, models)
        components.add_state("comparator", self.comparator)
        components.add_state("preference_replay", self.replay, records=REPLAY_RECORDS, check=replay_check)
        components.add_state("round_rewards", DictState(self, "_round_values"))
        return components

    def _checkpoint_restored(self, manifest: Any) -> None:
        super()._checkpoint_restored(manifest)
        self.outputs.reset(resumed=True)
        self._rewrite_shards = True


class MARLHFIterTrainer(MADPOIterTrainer, MARLHFTrainer):
    """Iterative MARLHF (see the module docstring and ``MARLHFIterConfig``); arguments as
    ``MARLHFTrainer``. The reward model, its tokenizer, the critics and every optimizer stay loaded
    for the whole run; each round's reward learning restarts from the initial reward model."""

    default_config_cls = MARLHFIterConfig
    config_family = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def __init__(self, *args: Any, metrics_callback: Any = None, critic_model: Any = None, critics: Optional[List[Any]] = None, **kwargs: Any):
        super().__init__(*args, metrics_callback=metrics_callback, critic_model=critic_model, critics=critics, **kwargs)
        self._reward_initial, _ = trainable_state(self.reward_model)
        self._reward_trained = False

    def _restart_reward_learning(self) -> None:
        """Back to the initial reward model and a fresh optimizer (no reload from disk)."""
        self.reward_model.load_state_dict(self._reward_initial, strict=False)
        self.reward_optimizer.state.clear()

    def _reward_phase(self) -> bool:
        learned = super()._reward_phase()
        self._reward_trained = self._reward_trained or learned
        return learned

    def _comparison_reward(self) -> RewardFunction:
        if self.args.preference_scoring_reward == "reward_model" and self._reward_trained:
            return self.learned_reward  # the previous round's reward model (raw = processed)
        return self.reward

    def _checkpoint_components(self) -> CheckpointComponents:
        components = super()._checkpoint_components()
        components.add_state("reward_initial_head", InitialRewardHead(self._reward_initial))
        components.add_state("reward_trained", AttributeState(self, "_reward_trained"))
        return components
