"""Iterative preference trainers: ``num_iterations`` rounds of comparisons against a comparator.

Round r (1-based), run by ``IterativeRounds``:
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
from typing import Any, Callable, Dict, List, Mapping, Optional

from comlrl.checkpoint import layout
from comlrl.checkpoint.state import AttributeState, CheckpointComponents
from comlrl.models.loading import check_model_config
from comlrl.models.reward_model import trainable_state
from comlrl.models.saving import save_pretrained_dir
from comlrl.rollout.rewards import RewardFunction, resolve_reward_range
from comlrl.trainers.preference.checkpointing import REPLAY_RECORDS, DictState, InitialRewardHead, replay_check
from comlrl.trainers.preference.collection import ItemCandidates, PreferencePair, comparison_pairs, score_candidates
from comlrl.trainers.preference.comparators import Comparator
from comlrl.trainers.preference.distributions import distribution_means, distribution_record, wandb_histograms, write_distribution_png
from comlrl.trainers.preference.iterative_config import MADPOIterConfig, MARLHFIterConfig
from comlrl.trainers.preference.madpo import MADPOTrainer, madpo_arguments
from comlrl.trainers.preference.marlhf import MARLHFTrainer
from comlrl.trainers.preference.output_paths import OutputDirs
from comlrl.trainers.preference.replay import PreferenceReplay, write_json_new, write_shard
from comlrl.trainers.preference.rounds import PreferenceRounds, rounds_attribute

__all__ = ["IterativeRounds", "MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]


def _empty_round_values() -> Dict[str, Any]:
    return {"target": [], "comparator": [], "scoring": "task"}


def distribution_range(config: Any, reward_func: Any) -> Optional[Any]:
    """The histograms' range of ``log_reward_distribution=True``: ``reward_func.reward_range`` (refused without one)."""
    if not config.log_reward_distribution:
        return None
    found = resolve_reward_range(reward_func) if reward_func is not None else None
    if found is None:
        raise ValueError(
            "log_reward_distribution=True requires reward_func.reward_range (the histograms' range): declare it with "
            "comlrl.utils.set_reward_range(reward_func, minimum, maximum)."
        )
    return found


class IterativeRounds(PreferenceRounds):
    """The rounds of the iterative trainers (see the module docstring) for ``trainer``, whose
    agents, comparator inputs and output settings they read. ``comparison_reward()``: what scores a
    round's comparisons (MARLHFIter may use its learned reward)."""

    def __init__(self, trainer: Any, reward_phase: Any = None, comparison_reward: Optional[Callable[[], RewardFunction]] = None):
        super().__init__(trainer.run, trainer.algorithm_name, reward_phase)
        a = trainer.args
        self.trainer = trainer
        self.distribution_range = trainer._distribution_range
        self.comparison_reward = comparison_reward or (lambda: trainer.task.reward)
        self.comparator = Comparator(trainer)
        self.replay = PreferenceReplay(a.preference_replay_mode, a.preference_replay_k, a.preference_replay_lambda, a.preference_replay_sample_size)
        self.round_values = _empty_round_values()
        self.outputs = OutputDirs(trainer.wandb_config, a.output_dir,
                                  {"preference_replay": a.preference_replay_dir, "policy_checkpoints": a.policy_checkpoint_dir})
        self.rewrite_shards = False
        contents = trainer.run.contents
        contents.on_restored.append(self.restored)
        trainer.run.after_epoch_checkpoint = self.epoch_checkpoint

    def num_rounds(self) -> int:
        return self.run.args.num_iterations

    def run_rounds(self) -> None:
        p = self.progress
        if self.rewrite_shards:  # a resumed run: its own copies of the shards its checkpoint holds
            for shard in self.replay.shards:
                write_shard(self.outputs.path("preference_replay"), shard.iteration, shard.pairs)
            self.rewrite_shards = False
        if p.round == 0 and p.phase == "collect" and self.run.args.policy_checkpoint_dir:
            self.export_policy("initial")  # the agents are still the initial policy until round 1 learns
        super().run_rounds()

    # ------------------------------------------------------------------ collection: comparisons
    def collection_phase(self) -> None:
        self.comparator.prepare_round()
        super().collection_phase()

    def collect_items(self, items: List[Any]) -> List[PreferencePair]:
        a, policies = self.run.args, self.run.team.policies
        target = self.candidates(items)
        comparator = self.comparator.candidates(target, a.comparator_num_candidates or a.preference_num_candidates, self.run.sampling())
        reward = self.comparison_reward()
        self.round_values["scoring"] = "task" if reward is self.run.task.reward else "reward_model"
        for side in (target, comparator):
            score_candidates(reward, side)
        pairs = [pair for t, c in zip(target, comparator) for pair in comparison_pairs(policies, t, c, a.pair_selection, a.preference_pairs_per_sample)]
        self.record_comparisons(target, comparator, len(pairs))
        return pairs

    def record_comparisons(self, target: List[ItemCandidates], comparator: List[ItemCandidates], pairs: int) -> None:
        self.round_values["target"].extend(v for c in target for v in c.raw_rewards.tolist())
        self.round_values["comparator"].extend(v for c in comparator for v in c.raw_rewards.tolist())
        self.record_collection(target, pairs)
        wins = sum(int((t.rewards[: c.count] > c.rewards[: t.count]).sum()) for t, c in zip(target, comparator))
        compared = sum(min(t.count, c.count) for t, c in zip(target, comparator))
        self.run.metrics.record({"collect/comparator_reward_mean": float(sum(float(c.rewards.mean()) for c in comparator) / len(comparator)),
                                 "collect/win_rate": wins / max(compared, 1)})

    def training_pairs(self, round_pairs: List[PreferencePair]) -> List[PreferencePair]:
        r = self.progress.round + 1
        write_shard(self.outputs.path("preference_replay"), r, round_pairs)
        self.replay.add(r, round_pairs)
        self.comparator.after_collection(self.progress.round)
        return self.replay.select(round_pairs)

    # ------------------------------------------------------------------ checkpoints and the round's end
    def phase_checkpoint_name(self, phase: str, epoch: Optional[int] = None) -> str:
        """``checkpoint-round-<R>-collected``, ``-reward-model``, ``-epoch-<E>`` for round R in progress."""
        return layout.phase_checkpoint_name(phase, self.progress.round + 1, epoch)

    def epoch_checkpoint(self, epoch: int, final: bool) -> None:
        # a round's last epoch is followed by the round's own checkpoint
        if not final and self.run.checkpoints.due_after_epoch(epoch, final):
            self.run.checkpoints.save_to_directory(self.phase_checkpoint_name("", epoch))

    def end_round(self) -> bool:
        p, state = self.progress, self.run.state
        r = p.round + 1
        if self.run.args.policy_checkpoint_dir:
            self.export_policy(f"iteration_{r:04d}")
        self.log_round(r)
        self.round_values, self.round_pairs = _empty_round_values(), []
        for reset in self.after_collection:
            reset()
        p.round, p.phase = r, "collect"
        state.epoch = state.position = 0
        self.run.checkpoints.commit(layout.phase_checkpoint_name("", r))  # checkpoint-round-<r>
        return True

    def export_policy(self, label: str) -> None:
        root = os.path.join(self.outputs.path("policy_checkpoints"), label)
        team = self.run.team
        for target, model, tokenizer in zip(self.trainer._agent_export_dirs(root), team.agents, team.tokenizers):
            save_pretrained_dir(target, model, tokenizer)

    def log_round(self, r: int) -> None:
        row = {
            "iter/current_iteration": float(r), "iter/current_preference_pairs": float(len(self.round_pairs)),
            "iter/total_preference_pairs": float(self.replay.total_pairs), "iter/train_preference_pairs": float(len(self.preference_pairs)),
        }
        if self.run.args.log_reward_distribution:
            record = self.distribution(r)
            directory = self.outputs.path("reward_distributions")
            write_json_new(os.path.join(directory, f"iteration_{r:04d}.json"), record)
            write_distribution_png(os.path.join(directory, f"iteration_{r:04d}.png"), record)
            row.update(distribution_means(record))
            wandb = self.run.reporting.wandb
            if wandb is not None:
                wandb.run.log(wandb_histograms(record), step=self.run.state.env_step)
        self.run.metrics.write(row, self.run.state.env_step)

    def distribution(self, r: int) -> Dict[str, Any]:
        values = self.round_values
        selected = [(p.target_raw_reward, p.comparator_raw_reward) for p in self.preference_pairs]
        series = {
            ("candidate", "target"): values["target"], ("candidate", "comparator"): values["comparator"],
            ("selected", "target"): [t for t, _ in selected if t is not None],
            ("selected", "comparator"): [c for _, c in selected if c is not None],
        }
        reward_range = self.distribution_range if values["scoring"] == "task" else None  # learned scores: their own range
        return distribution_record(r, series, reward_range)

    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        super().add_checkpoint_state(components)
        for name, models in self.comparator.models().items():
            components.add_models(name, models)
        components.add_state("comparator", self.comparator)
        components.add_state("preference_replay", self.replay, records=REPLAY_RECORDS, check=replay_check)
        components.add_state("round_rewards", DictState(self, "round_values"))

    def restored(self, manifest: Mapping[str, Any]) -> None:
        self.outputs.reset(resumed=True)
        self.rewrite_shards = True


class MADPOIterTrainer(MADPOTrainer):
    """Iterative MADPO (see the module docstring and ``MADPOIterConfig``); arguments as ``MADPOTrainer``."""

    algorithm = "madpo_iter"
    algorithm_name = "MADPOIter"
    default_config_cls = MADPOIterConfig
    config_family = MADPOIterConfig

    def __init__(self, *args: Any, **kwargs: Any):
        given = madpo_arguments(args, kwargs)
        config = given["args"] if given["args"] is not None else self.default_config_cls()
        self._distribution_range = distribution_range(config, given["reward_func"])
        self._preference_model_config = check_model_config(given["model_config"])
        super().__init__(*args, **kwargs)

    def _rounds(self) -> PreferenceRounds:
        return IterativeRounds(self._weak)

    comparator = rounds_attribute("comparator", "The comparator the team meets every round (``comparators.Comparator``).")
    replay = rounds_attribute("replay", "Every round's pairs and the selection a round trains on (``replay.PreferenceReplay``).")
    outputs = rounds_attribute("outputs", "The folders the rounds write into (``output_paths.OutputDirs``).")


class MARLHFIterTrainer(MARLHFTrainer):
    """Iterative MARLHF (see the module docstring and ``MARLHFIterConfig``); arguments as
    ``MARLHFTrainer``. The reward model, its tokenizer, the critics and every optimizer stay loaded
    for the whole run; each round's reward learning restarts from the initial reward model."""

    algorithm = "marlhf_iter"
    algorithm_name = "MARLHFIter"
    default_config_cls = MARLHFIterConfig
    config_family = MARLHFIterConfig

    def __init__(self, *args: Any, metrics_callback: Any = None, critic_model: Any = None, critics: Optional[List[Any]] = None, **kwargs: Any):
        given = madpo_arguments(args, kwargs)
        config = given["args"] if given["args"] is not None else self.default_config_cls()
        self._distribution_range = distribution_range(config, given["reward_func"])
        self._preference_model_config = check_model_config(given["model_config"])
        super().__init__(*args, metrics_callback=metrics_callback, critic_model=critic_model, critics=critics, **kwargs)

    def _rounds(self) -> PreferenceRounds:
        learning = self.reward_learning
        self._reward_initial, _ = trainable_state(learning.model)
        self._reward_trained = False
        weak = self._weak
        learning.restart = lambda: weak._restart_reward_learning()
        rounds = IterativeRounds(weak, lambda pairs: weak._reward_phase(pairs), lambda: weak._comparison_reward())
        self.run.contents.contributors.append(_IterativeRewardState(weak))
        return rounds

    def _restart_reward_learning(self) -> None:
        """Back to the initial reward model and a fresh optimizer (no reload from disk)."""
        self.reward_learning.model.load_state_dict(self._reward_initial, strict=False)
        self.reward_learning.optimizer.optimizer.state.clear()

    def _reward_phase(self, pairs: List[PreferencePair]) -> bool:
        learned = self.reward_learning.learn(pairs)
        self._reward_trained = self._reward_trained or learned
        return learned

    def _comparison_reward(self) -> RewardFunction:
        if self.args.preference_scoring_reward == "reward_model" and self._reward_trained:
            return self.reward_learning.learned_reward  # the previous round's reward model (raw = processed)
        return self.task.reward

    comparator = rounds_attribute("comparator", "The comparator the team meets every round (``comparators.Comparator``).")
    replay = rounds_attribute("replay", "Every round's pairs and the selection a round trains on (``replay.PreferenceReplay``).")
    outputs = rounds_attribute("outputs", "The folders the rounds write into (``output_paths.OutputDirs``).")


class _IterativeRewardState:
    """MARLHFIter's checkpoint state: the initial reward head (each round restarts from it) and
    whether a reward model was trained yet."""

    def __init__(self, trainer: MARLHFIterTrainer):
        self.trainer = trainer

    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        components.add_state("reward_initial_head", InitialRewardHead(self.trainer._reward_initial))
        components.add_state("reward_trained", AttributeState(self.trainer, "_reward_trained"))
