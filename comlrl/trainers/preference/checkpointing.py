"""Checkpoint pieces of the preference trainers: record types and state adapters.

What a preference checkpoint holds beyond the RL trainers' (see docs/checkpoints.md):
``preference_progress`` (round, phase, collection cursor, update count), ``preference_pairs`` and
``round_pairs`` (``PreferencePair`` records with their id tensors), ``epoch_order``; MARLHF adds the
reward model, its optimizer and the actor-critic engine's critics, optimizers and buffers; the
iterative trainers add ``preference_replay`` (every round's pairs), ``comparator`` (RNG streams,
which rounds the history copies hold) with the history copies as models, ``round_rewards`` (the
raw rewards behind this round's distribution files) and, for MARLHFIter, the reward model's
initial head and whether it has been trained.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch

from comlrl.trainers.preference.collection import AgentPreferenceTensors, PreferencePair
from comlrl.trainers.preference.replay import ReplayShard
from comlrl.checkpoint.files import CheckpointError

PAIR_RECORDS = (PreferencePair, AgentPreferenceTensors)
REPLAY_RECORDS = PAIR_RECORDS + (ReplayShard,)


def pair_list_check(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not isinstance(value, list) or not all(isinstance(p, PreferencePair) for p in value):
            raise CheckpointError(f"{name} in the checkpoint must be a list of PreferencePair records.")

    return check


def replay_check(value: Any) -> None:
    shards = value.get("shards") if isinstance(value, dict) else None
    if not isinstance(shards, list) or not all(isinstance(s, ReplayShard) for s in shards):
        raise CheckpointError("preference_replay in the checkpoint must hold a list of ReplayShard records.")
    if [s.iteration for s in shards] != list(range(1, len(shards) + 1)):
        raise CheckpointError(f"preference_replay shards must be rounds 1..N in order, found {[s.iteration for s in shards]}.")


class InitialRewardHead:
    """The reward head's initial weights (what MARLHFIter restarts reward learning from each round)."""

    def __init__(self, initial: Dict[str, torch.Tensor]):
        self.initial = initial

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {k: v for k, v in self.initial.items() if k.startswith("reward_head.")}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            self.initial[key] = value.clone()


class DictState:
    """Checkpoints a dict attribute of lists by value (e.g. the round's raw rewards)."""

    def __init__(self, owner: Any, name: str):
        self.owner, self.name = owner, name

    def state_dict(self) -> Dict[str, List[float]]:
        return {str(k): list(v) if isinstance(v, list) else v for k, v in getattr(self.owner, self.name).items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        setattr(self.owner, self.name, {k: list(v) if isinstance(v, list) else v for k, v in state.items()})
