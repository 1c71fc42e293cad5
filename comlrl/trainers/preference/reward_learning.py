"""Reward learning of MARLHF: score joint texts with a ``JointRewardModel``, train it with
Bradley-Terry on preference pairs, and use it, frozen, as an ordinary reward function.

- ``RewardScorer`` encodes joint texts with the reward model's own tokenizer (texts longer than
  ``max_length`` keep their end, with one warning) and scores rows in one batched forward.
- ``train_bradley_terry`` runs epochs of shuffled pair batches: winners and losers of a batch in ONE
  forward, loss ``mean -log sigmoid(s_w - s_l)``, one optimizer step per batch.
- ``LearnedJointReward`` follows the reward calling convention (``f(*completions, prompts=,
  batch_items=)``), so the RL backends use it exactly like a task reward.
- ``RewardLearning`` is MARLHF's part that holds all of it: the model, its tokenizer, device,
  optimizer and scorer, the learned reward, the reward phase of a round, checkpoint state and export.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from comlrl.checkpoint.state import CheckpointComponents
from comlrl.core.preference import bradley_terry_loss
from comlrl.models.reward_model import JointRewardModel, joint_text, load_reward_model, load_reward_tokenizer, save_reward_model
from comlrl.parallel.devices import resolve_devices
from comlrl.rollout.batch import left_pad, position_ids_from_mask
from comlrl.rollout.rewards import RewardFunction
from comlrl.telemetry.progress import library_bars
from comlrl.trainers.optim import AgentOptimizer


def resolve_reward_device(spec: Optional[str], fallback: torch.device) -> torch.device:
    """``reward_model_device`` as a device: None is ``fallback`` (the trainer's device); a CUDA device
    this host lacks falls back to ``fallback`` with one warning; anything else invalid raises."""
    if spec is None:
        return fallback
    try:
        return resolve_devices(spec, 1, "reward_model_device")[0]
    except ValueError:
        if not str(spec).strip().lower().startswith("cuda"):
            raise
    warnings.warn(
        f"reward_model_device={spec!r} is not available on this host; the reward model uses the trainer's device "
        f"{fallback} instead. Set reward_model_device (None = the trainer's device) to silence this.",
        stacklevel=3,
    )
    return fallback


class RewardScorer:
    """Encoding and batched scoring of joint texts by one reward model."""

    def __init__(self, model: JointRewardModel, tokenizer: Any, device: torch.device, max_length: Optional[int] = None):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.pad_id = int(tokenizer.pad_token_id)
        limit = max_length
        if limit is None:
            limit = getattr(getattr(model.backbone, "config", None), "max_position_embeddings", None)
        self.max_length: Optional[int] = int(limit) if limit else None
        self._warned = False

    def encode(self, texts: Sequence[str]) -> List[torch.Tensor]:
        """Token ids of each text; longer than ``max_length``: the last ``max_length`` tokens."""
        encoded = self.tokenizer(list(texts))
        rows = encoded["input_ids"] if hasattr(encoded, "keys") else encoded.input_ids
        out = []
        for row in rows:
            ids = torch.tensor(row, dtype=torch.long)
            if self.max_length is not None and ids.numel() > self.max_length:
                if not self._warned:
                    warnings.warn(
                        f"A joint text of {ids.numel()} tokens is longer than the reward model reads ({self.max_length}); "
                        f"its first {ids.numel() - self.max_length} tokens are dropped (the responses at its end are "
                        f"kept). Raise reward_max_length or shorten prompts. (Warned once.)",
                        stacklevel=3,
                    )
                    self._warned = True
                ids = ids[-self.max_length :]
            out.append(ids)
        return out

    def forward(self, ids: Sequence[torch.Tensor]) -> torch.Tensor:
        """``[len(ids)]`` float32 scores in one forward (grad mode is the caller's)."""
        input_ids, mask = left_pad(ids, self.pad_id)
        positions = position_ids_from_mask(mask)
        self.model.eval()  # no dropout: the scores the pairs are trained on are the ones used later
        return self.model(input_ids.to(self.device), mask.to(self.device), positions.to(self.device))

    def score_texts(self, texts: Sequence[str], chunk: Optional[int] = None) -> List[float]:
        """Scores without gradient, ``chunk`` rows per forward (None: all at once)."""
        if not texts:
            return []
        ids = self.encode(texts)
        size = chunk or len(ids)
        with torch.no_grad():
            parts = [self.forward(ids[s : s + size]).cpu() for s in range(0, len(ids), size)]
        return torch.cat(parts).tolist()


def train_bradley_terry(
    scorer: RewardScorer,
    optimizer: AgentOptimizer,
    winners: Sequence[str],
    losers: Sequence[str],
    *,
    epochs: int,
    batch_size: int,
    micro_batch_size: Optional[int] = None,
    record: Optional[Callable[[Dict[str, float]], None]] = None,
) -> Dict[str, float]:
    """Bradley-Terry training on (winner, loser) joint texts; returns the last epoch's means
    (``loss``, ``accuracy`` = P[s_w > s_l], ``margin`` = mean s_w - s_l, ``grad_norm``).

    Each epoch visits the pairs in a random order (torch's global RNG) in batches of
    ``batch_size``; each batch is one optimizer step (micro-batches of ``micro_batch_size`` pairs
    accumulate into it). Every step's metrics go to ``record``.
    """
    winner_ids, loser_ids = scorer.encode(winners), scorer.encode(losers)
    count = len(winner_ids)
    last: Dict[str, float] = {}
    for _ in range(epochs):
        order = torch.randperm(count).tolist()
        sums: Dict[str, float] = {}
        steps = 0
        for start in range(0, count, batch_size):
            batch = order[start : start + batch_size]
            metrics = _bradley_terry_step(scorer, optimizer, [winner_ids[i] for i in batch], [loser_ids[i] for i in batch], micro_batch_size)
            if record is not None:
                record({f"reward_model/{k}": v for k, v in metrics.items()})
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            steps += 1
        last = {key: value / max(steps, 1) for key, value in sums.items()}
    return last


def _bradley_terry_step(scorer: RewardScorer, optimizer: AgentOptimizer, winners: List[torch.Tensor], losers: List[torch.Tensor], micro: Optional[int]) -> Dict[str, float]:
    size = micro or len(winners)
    totals = {"loss": 0.0, "accuracy": 0.0, "margin": 0.0}
    for start in range(0, len(winners), size):
        stop = min(start + size, len(winners))
        scores = scorer.forward(winners[start:stop] + losers[start:stop])  # winners and losers in one forward
        s_w, s_l = scores[: stop - start], scores[stop - start :]
        share = (stop - start) / len(winners)
        loss = bradley_terry_loss(s_w, s_l)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"reward learning: the Bradley-Terry loss is {float(loss.detach())}. Lower reward_learning_rate or set max_grad_norm."
            )
        optimizer.backward(loss * share, last=stop == len(winners))
        with torch.no_grad():
            margins = (s_w - s_l).float()
            totals["loss"] += float(loss.detach()) * share
            totals["accuracy"] += float((margins > 0).float().mean()) * share
            totals["margin"] += float(margins.mean()) * share
    totals["grad_norm"] = optimizer.step("reward model (Bradley-Terry)")
    return totals


class LearnedJointReward:
    """The frozen reward model as a reward function: ``f(*completions, prompts=, batch_items=)``
    returns the score of each joint response ``joint_text(prompts, (c_0[j], ..., c_{N-1}[j]))``."""

    __name__ = "learned_joint_reward"

    def __init__(self, scorer: RewardScorer, chunk: Optional[int] = None):
        self.scorer = scorer
        self.chunk = chunk

    def __call__(self, *completions: Sequence[str], prompts: Optional[Sequence[str]] = None, batch_items: Any = None) -> List[float]:
        prompts = list(prompts or [])
        count = len(completions[0]) if completions else 0
        texts = [joint_text(prompts, [agent[j] for agent in completions]) for j in range(count)]
        return self.scorer.score_texts(texts, self.chunk)


class RewardLearning:
    """MARLHF's joint reward model and its learning (see the module docstring). ``restart``: what runs
    before each round's learning (MARLHFIter: back to the initial reward model)."""

    def __init__(self, args: Any, run: Any, model: JointRewardModel, tokenizer: Any, device: torch.device, optimizer: AgentOptimizer,
                 num_agents: int):
        self.args = args
        self.run = run
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.optimizer = optimizer
        self.scorer = RewardScorer(model, tokenizer, device, args.reward_max_length)
        self.learned_reward = RewardFunction(LearnedJointReward(self.scorer, args.update_micro_batch_size), num_agents)
        self.restart: Callable[[], None] = lambda: None

    @classmethod
    def load(cls, args: Any, source: Any, model_config: Dict[str, Any], team: Any, num_agents: int, verbose: bool) -> "RewardLearning":
        """Load the reward model of ``source`` (with its tokenizer) on ``reward_model_device`` and make its optimizer."""
        device = resolve_reward_device(args.reward_model_device, team.devices[0])
        tokenizer = load_reward_tokenizer(source)
        with library_bars(verbose):
            model = load_reward_model(source, model_config=model_config, device=device, freeze_backbone=args.reward_freeze_backbone)
        optimizer = team.make_optimizer([p for p in model.parameters() if p.requires_grad], args.reward_learning_rate)
        return cls(args, None, model, tokenizer, device, optimizer, num_agents)

    def learn(self, pairs: Sequence[Any]) -> bool:
        """Bradley-Terry training on ``pairs``' joint texts; the model is fixed afterwards."""
        if not pairs:
            return False
        a, metrics = self.args, self.run.metrics
        self.restart()
        winners = [joint_text(p.prompts, p.winner_completions) for p in pairs]
        losers = [joint_text(p.prompts, p.loser_completions) for p in pairs]
        train_bradley_terry(self.scorer, self.optimizer, winners, losers, epochs=a.reward_num_train_epochs,
                            batch_size=a.reward_train_batch_size, micro_batch_size=a.update_micro_batch_size, record=metrics.record)
        self.optimizer.optimizer.state.clear()  # the reward model is fixed from here on: release its AdamW moments
        self.model.eval()
        metrics.flush(self.run.state.env_step, force=True)
        return True

    def add_checkpoint_state(self, components: CheckpointComponents) -> None:
        components.add_models("reward_model", self.model)
        components.add_optimizers("reward_optimizer", self.optimizer.optimizer)

    def save(self, target: str, overwrite: bool, verbose: bool) -> None:
        """``target``: the reward backbone, ``reward_head.pt`` and the reward tokenizer."""
        with library_bars(verbose):
            save_reward_model(target, self.model, self.tokenizer, overwrite)
