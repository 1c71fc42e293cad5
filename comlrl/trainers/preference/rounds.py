"""The rounds of a preference run (``PreferenceRounds``, the body a preference trainer's run drives):

  1. collect   over the training set, batch by batch: candidates of every agent, their rewards,
               the pairs kept (``collect_items``; resumable at any batch)
  2. reward    reward learning on the round's pairs (MARLHF's Bradley-Terry phase; none for MADPO)
  3. policy    ``num_train_epochs`` of the run's epoch loop over the learner's step (MADPO: batches
               of pairs; MARLHF: online RL over the training set)
  4. round end another round or the end (iterative trainers: ``iterative.IterativeRounds``)

A checkpoint is taken after collection, after reward learning and on the run's own schedule; the
cursor (``PreferenceProgress``) and the round's pairs are checkpoint state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Protocol, Sequence

import torch

from comlrl.checkpoint import layout
from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.state import AttributeState, CheckpointComponents, DataclassState
from comlrl.telemetry.progress import ProgressBar
from comlrl.trainers.datasets import dataset_length
from comlrl.trainers.preference.checkpointing import PAIR_RECORDS, pair_list_check
from comlrl.trainers.preference.collection import ItemCandidates, PreferencePair, candidate_pairs, collect_candidates, score_candidates
from comlrl.trainers.run import Run, dataset_steps, owner_view

PHASES = ("collect", "reward", "policy")
GENERATION_ROWS = 64  # default candidates per generate call (collection_batch_size=None)


@dataclass
class PreferenceProgress:
    """Where a preference run is, beyond the epoch cursor (``TrainingState``) of its learning phase."""

    round: int = 0  # rounds complete (iterative trainers)
    phase: str = "collect"  # the phase to run next: collect -> reward (MARLHF) -> policy
    collected: int = 0  # items of the training set collected so far in this round
    updates: int = 0  # MADPO updates so far (the eval schedule counts them)


class RewardPhase(Protocol):
    def __call__(self, pairs: Sequence[PreferencePair]) -> bool:
        """Reward learning on ``pairs``; True if it ran."""


class PreferenceRounds:
    """The phases of every round from where ``progress`` points (see the module docstring).
    ``reward_phase``: MARLHF's reward learning (None: no such phase)."""

    def __init__(self, run: Run, name: str, reward_phase: Optional[RewardPhase] = None):
        self.run = owner_view(run)  # the run owns its body, these rounds
        self.name = name
        self.reward_phase = reward_phase
        self.progress = PreferenceProgress()
        self.preference_pairs: List[PreferencePair] = []  # what the learning phase trains on
        self.round_pairs: List[PreferencePair] = []  # this round's collected pairs
        self.after_collection: List[Callable[[], None]] = []  # a learner's reset for the new pairs

    # ------------------------------------------------------------------ the body
    def num_rounds(self) -> int:
        return 1

    def run_rounds(self) -> None:
        p, run = self.progress, self.run
        while p.round < self.num_rounds():
            if p.phase == "collect":
                self.collection_phase()
                p.phase = "reward"
                run.checkpoints.commit(self.phase_checkpoint_name("collected"))
            if p.phase == "reward":
                learned = self.reward_phase(self.preference_pairs) if self.reward_phase is not None and self.preference_pairs else False
                p.phase = "policy"
                if learned:
                    run.checkpoints.commit(self.phase_checkpoint_name("reward-model"))
            if self.preference_pairs:
                run.run_epochs()  # the run's epoch loop over the learner's steps
            elif run.verbose and run.state.epoch == 0:
                print(f"{self.name}: no preference pairs this round (every candidate tied); nothing to learn.")
            if not self.end_round():
                return

    def phase_checkpoint_name(self, phase: str, epoch: Optional[int] = None) -> str:
        """``checkpoint-collected`` / ``checkpoint-reward-model`` (epochs keep ``checkpoint-<E>``)."""
        return layout.phase_checkpoint_name(phase, epoch=epoch)

    def end_round(self) -> bool:
        """Called after a round's learning; True to start another round (iterative trainers)."""
        return False

    # ------------------------------------------------------------------ collection
    def collection_batch_size(self) -> int:
        a = self.run.args
        return a.collection_batch_size or max(a.rollout_buffer_size, GENERATION_ROWS // a.preference_num_candidates)

    def collection_phase(self) -> None:
        """Collect this round's pairs over the training set (resumable at any step)."""
        p, run = self.progress, self.run
        state, metrics = run.state, run.metrics
        dataset = run.task.train_dataset
        bar = ProgressBar(total=dataset_length(dataset), initial=p.collected, enabled=run.verbose,
                          desc=f"{self.name} collect" + (f" (round {p.round + 1})" if self.num_rounds() > 1 else ""))
        try:
            for start, items in dataset_steps(dataset, p.collected, self.collection_batch_size()):
                self.round_pairs.extend(self.collect_items(items))
                p.collected = start + len(items)
                state.global_step += 1
                bar.update(len(items), metrics.flush(state.env_step))
                run.checkpoints.after_step(state.global_step)
        finally:
            bar.close()
        metrics.flush(state.env_step, force=True)
        p.collected = 0
        self.preference_pairs = self.training_pairs(self.round_pairs)
        for reset in self.after_collection:
            reset()
        state.epoch = state.position = 0

    def item_prompts(self, items: Sequence[Any]) -> List[List[str]]:
        return [[formatter(item) for item in items] for formatter in self.run.task.formatters]

    def candidates(self, items: List[Any]) -> List[ItemCandidates]:
        """K candidates of every agent for each of ``items`` (one generate call per agent)."""
        run, team = self.run, self.run.team
        return collect_candidates(team.policies, self.item_prompts(items), items, run.args.preference_num_candidates, run.sampling(),
                                  team.step_seed(), team.workers.map)

    def collect_items(self, items: List[Any]) -> List[PreferencePair]:
        """Candidates of a batch of items, their rewards, and the pairs kept."""
        a, policies = self.run.args, self.run.team.policies
        candidates = self.candidates(items)
        score_candidates(self.run.task.reward, candidates)
        pairs = [pair for c in candidates for pair in candidate_pairs(policies, c, a.pair_selection, a.preference_pairs_per_sample)]
        self.record_collection(candidates, len(pairs))
        return pairs

    def record_collection(self, candidates: Sequence[ItemCandidates], pairs: int) -> None:
        rewards = torch.cat([c.rewards for c in candidates])
        self.run.metrics.record({
            "collect/reward_mean": float(rewards.mean()), "collect/reward_std": float(rewards.std(unbiased=False)),
            "collect/pairs_per_item": pairs / len(candidates),
        })

    def training_pairs(self, round_pairs: List[PreferencePair]) -> List[PreferencePair]:
        """What this round learns from (iterative trainers mix in replayed rounds)."""
        return list(round_pairs)

    # ------------------------------------------------------------------ checkpoint contents
    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        progress = DataclassState(self.progress)
        components.add_state("preference_progress", progress, check=self._check_progress(progress))
        components.add_state("preference_pairs", AttributeState(self, "preference_pairs"), records=PAIR_RECORDS,
                             check=pair_list_check("preference_pairs"))
        components.add_state("round_pairs", AttributeState(self, "round_pairs"), records=PAIR_RECORDS, check=pair_list_check("_round_pairs"))

    def _check_progress(self, progress: DataclassState):
        def check(state: Any) -> None:
            progress.check(state)
            if state["phase"] not in PHASES:
                raise CheckpointError(f"The checkpoint's preference phase {state['phase']!r} is not one of {PHASES}.")
            for name in ("round", "collected", "updates"):
                value = state[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise CheckpointError(f"The checkpoint's preference progress {name}={value!r} is not a non-negative integer.")
            if state["round"] > self.num_rounds():
                raise CheckpointError(
                    f"The checkpoint has {state['round']} rounds complete but this run has {self.num_rounds()}; raise num_iterations to resume it."
                )

        return check


def rounds_attribute(name: str, doc: str) -> property:
    """A trainer's read-only view of its rounds' attribute ``name`` (``trainer.progress``,
    ``trainer.preference_pairs``, the iterative trainers' ``comparator``, ``replay``, ``outputs``)."""
    return property(lambda trainer: getattr(trainer.rounds, name), doc=doc)


PROGRESS = rounds_attribute("progress", "Where the run is: round, phase, items collected, updates (``PreferenceProgress``).")
PREFERENCE_PAIRS = rounds_attribute("preference_pairs", "The pairs the learning phase trains on (this round's, and replayed ones in iterative runs).")
