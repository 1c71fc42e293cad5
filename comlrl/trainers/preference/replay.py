"""Replay of earlier rounds' preference pairs (iterative trainers) and the shard files.

Each round's pairs are kept in memory (ids included, never re-tokenized) as one shard; a round then
trains on ``preference_replay_mode``'s selection:

- ``current``: this round's pairs;
- ``nearest_k`` / ``all_history`` / ``lambda_decay``: S pairs drawn from the shards, each draw
  picking a shard by ``replay_weights``; inside a shard, pairs are drawn without replacement while
  they last (``shard_draw``); the drawn pairs are shuffled together.

Every round's pairs are also written to ``iteration_NNNN.json`` (1-based round number; written
even when the round had no pair) in the replay directory::

    {"iteration": N, "num_pairs": P, "pairs": [{"prompts": [...], "winner_completions": [...],
      "loser_completions": [...], "winner_reward": w, "loser_reward": l, "candidate_reward_mean": m,
      "raw_rewards": [w_raw, l_raw], "target_raw_reward": t, "comparator_raw_reward": c}, ...]}
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from comlrl.core.preference import replay_allocation, replay_sample_size, replay_weights, shard_draw
from comlrl.trainers.preference.collection import PreferencePair


@dataclass
class ReplayShard:
    """The pairs of one round (``iteration`` is 1-based)."""

    iteration: int
    pairs: List[PreferencePair]


class PreferenceReplay:
    """Every round's pairs, oldest first (empty rounds too: their files are written again on resume)."""

    def __init__(self, mode: str, k: Optional[int], lam: Optional[float], sample_size: Optional[int]):
        self.mode, self.k, self.lam, self.sample_size = mode, k, lam, sample_size
        self.shards: List[ReplayShard] = []
        self.total_pairs = 0

    def add(self, iteration: int, pairs: List[PreferencePair]) -> None:
        self.total_pairs += len(pairs)
        self.shards.append(ReplayShard(iteration, list(pairs)))

    def select(self, current: List[PreferencePair]) -> List[PreferencePair]:
        """The pairs this round trains on (torch's global RNG draws them)."""
        if self.mode == "current":
            return list(current)
        sizes = [len(s.pairs) for s in self.shards]
        weights = replay_weights(sizes, self.mode, k=self.k, lam=self.lam)
        counts = replay_allocation(weights, replay_sample_size(self.sample_size, len(current), sizes))
        drawn = [shard.pairs[i] for shard, count in zip(self.shards, counts.tolist()) for i in shard_draw(len(shard.pairs), count).tolist()]
        return [drawn[i] for i in torch.randperm(len(drawn)).tolist()]

    def state_dict(self) -> Dict[str, Any]:
        return {"shards": list(self.shards), "total_pairs": self.total_pairs}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.shards, self.total_pairs = list(state["shards"]), int(state["total_pairs"])


def pair_record(pair: PreferencePair) -> Dict[str, Any]:
    return {
        "prompts": list(pair.prompts), "winner_completions": list(pair.winner_completions),
        "loser_completions": list(pair.loser_completions), "winner_reward": float(pair.winner_reward),
        "loser_reward": float(pair.loser_reward), "candidate_reward_mean": float(pair.candidate_reward_mean),
        "raw_rewards": [float(r) for r in (pair.raw_rewards or [])],
        "target_raw_reward": None if pair.target_raw_reward is None else float(pair.target_raw_reward),
        "comparator_raw_reward": None if pair.comparator_raw_reward is None else float(pair.comparator_raw_reward),
    }


def shard_path(directory: str, iteration: int) -> str:
    return os.path.join(directory, f"iteration_{iteration:04d}.json")


def write_json_new(path: str, value: Any) -> None:
    """Write ``path`` atomically; an existing file is never replaced (FileExistsError)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=".tmp.", suffix=".json", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(value, out, ensure_ascii=False, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.link(staging, path)  # fails if the name exists: nothing saved is overwritten
    finally:
        os.remove(staging)


def write_shard(directory: str, iteration: int, pairs: List[PreferencePair]) -> str:
    path = shard_path(directory, iteration)
    write_json_new(path, {"iteration": iteration, "num_pairs": len(pairs), "pairs": [pair_record(p) for p in pairs]})
    return path


def read_shard(path: str) -> List[Dict[str, Any]]:
    """The pair records of a shard file (a bare list of records is accepted too; non-dicts skipped)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    records = data.get("pairs", []) if isinstance(data, dict) else data
    return [r for r in records if isinstance(r, dict)]
