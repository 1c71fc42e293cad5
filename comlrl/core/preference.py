"""Preference learning maths: Bradley-Terry, the joint-margin MADPO loss, pair selection and replay
sampling (pure tensor functions).

Shapes: B preference pairs; K candidates of one prompt; S replay shards (oldest first).

- Bradley-Terry (reward learning): ``P(w > l) = sigmoid(s_w - s_l)``, loss ``-log sigmoid(s_w - s_l)``.
- MADPO (reference-free multi-agent DPO): every agent i contributes the log-likelihood margin
  ``Delta_i = log pi_i(y_w^i | x^i) - log pi_i(y_l^i | x^i)`` of its part of the joint winner over
  its part of the joint loser; the team's implicit reward margin is ``beta * sum_i Delta_i`` and the
  loss is ``L = -log sigmoid(beta * sum_i Delta_i)``. Its gradient for agent i is
  ``-beta * sigmoid(-beta * sum_j Delta_j) * grad Delta_i``, so agents are credited jointly.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

PAIR_SELECTIONS = ("reward_gap", "random", "all")
COMPARISON_SELECTIONS = PAIR_SELECTIONS + ("comparator_reward",)
REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")


# ----------------------------------------------------------------------------- losses
def bradley_terry_loss(winner_scores: torch.Tensor, loser_scores: torch.Tensor) -> torch.Tensor:
    """``mean_b -log sigmoid(s_w[b] - s_l[b])``: ``[B], [B] -> []`` (float32)."""
    return -F.logsigmoid(winner_scores.float() - loser_scores.float()).mean()


def joint_margin_loss(margins: torch.Tensor, beta: float) -> torch.Tensor:
    """MADPO loss ``mean_b -log sigmoid(beta * margins[b])`` with ``margins = sum_i Delta_i``: ``[B] -> []``.

    To step agent i alone, pass ``Delta_i`` (with grad) plus the other agents' margins detached:
    the gradient is then exactly the joint loss's gradient with respect to agent i.
    """
    return -F.logsigmoid(beta * margins.float()).mean()


def preference_accuracy(margins: torch.Tensor) -> torch.Tensor:
    """Fraction of pairs whose winner is preferred (margin > 0): ``[B] -> []``."""
    return (margins > 0).float().mean()


# ----------------------------------------------------------------------------- pair selection
def strict_pairs(rewards: torch.Tensor) -> torch.Tensor:
    """Every ordered pair ``(i, j)`` with ``r_i - r_j > 0`` strictly, in row-major ``(i, j)`` order.

    Ties and NaN rewards give no pair. ``[K] -> [P, 2]`` long (winner index, loser index).
    """
    r = rewards.float()
    gaps = r.unsqueeze(1) - r.unsqueeze(0)  # gaps[i, j] = r_i - r_j
    return (gaps > 0).nonzero()  # nonzero is row-major: sorted by (i, j)


def order_pairs(gaps: torch.Tensor, mode: str, *, tie_break: Optional[torch.Tensor] = None,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A permutation of P candidate pairs (``[P] -> [P]`` long) under a selection mode.

    - ``reward_gap``: by ``|gap|`` descending (stable, so equal gaps keep their given order);
    - ``comparator_reward``: by ``tie_break`` (the comparator side's reward) descending, then ``|gap|``
      descending;
    - ``random``: uniformly random (``torch.randperm`` with ``generator``; None = torch's global RNG);
    - ``all``: the given order.
    """
    count = gaps.numel()
    if mode == "all":
        return torch.arange(count)
    if mode == "random":
        return torch.randperm(count, generator=generator)
    order = torch.sort(gaps.abs(), descending=True, stable=True).indices
    if mode == "reward_gap":
        return order
    if mode == "comparator_reward":
        if tie_break is None:
            raise ValueError("comparator_reward ordering needs the comparator rewards (tie_break).")
        second = torch.sort(tie_break.float()[order], descending=True, stable=True).indices
        return order[second]
    raise ValueError(f"pair selection must be one of {COMPARISON_SELECTIONS}, got {mode!r}.")


def select_candidate_pairs(rewards: torch.Tensor, mode: str, limit: Optional[int],
                           generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Preference pairs among K candidates of one prompt: ``[K] -> [P', 2]`` (winner, loser).

    All strict pairs (``strict_pairs``), ordered by ``mode`` (``order_pairs``), the first ``limit``
    kept (None: all).
    """
    if mode not in PAIR_SELECTIONS:
        raise ValueError(f"pair_selection must be one of {PAIR_SELECTIONS}, got {mode!r}.")
    pairs = strict_pairs(rewards)
    if pairs.numel() == 0:
        return pairs
    r = rewards.float()
    gaps = r[pairs[:, 0]] - r[pairs[:, 1]]
    pairs = pairs[order_pairs(gaps, mode, generator=generator)]
    return pairs if limit is None else pairs[:limit]


def select_comparisons(target_rewards: torch.Tensor, comparator_rewards: torch.Tensor, mode: str,
                       limit: Optional[int], generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Candidate j of the current policy against candidate j of the comparator (iterative trainers).

    For ``j < min(K, K_c)``: ``gap_j = r_target[j] - r_comparator[j]``; ``gap > 0`` means the current
    policy wins, ``< 0`` the comparator wins, 0 (or NaN) gives no pair. Returns the chosen indices j
    (``[P']`` long) ordered by ``mode``, the first ``limit`` kept (None: all).
    """
    if mode not in COMPARISON_SELECTIONS:
        raise ValueError(f"pair_selection must be one of {COMPARISON_SELECTIONS}, got {mode!r}.")
    count = min(target_rewards.numel(), comparator_rewards.numel())
    target, comparator = target_rewards.float()[:count], comparator_rewards.float()[:count]
    gaps = target - comparator
    kept = (gaps != 0) & ~torch.isnan(gaps)
    indices = kept.nonzero().squeeze(-1)
    order = order_pairs(gaps[indices], mode, tie_break=comparator[indices], generator=generator)
    indices = indices[order]
    return indices if limit is None else indices[:limit]


# ----------------------------------------------------------------------------- replay
def replay_weights(sizes: Sequence[int], mode: str, *, k: Optional[int] = None, lam: Optional[float] = None) -> torch.Tensor:
    """Sampling weight of each stored shard (``sizes``: pairs per shard, oldest first): ``[S] -> [S]``.

    Empty shards get weight 0. Over the non-empty shards, with age ``a`` (0 = the newest):

    - ``current``: the newest only;
    - ``nearest_k``: the newest ``k``, equally;
    - ``all_history``: all, equally;
    - ``lambda_decay``: ``w_a = lam^a / sum_b lam^b`` (``lam = 1``: uniform; ``lam = 0``: the newest only).

    Returns zeros when every shard is empty; otherwise the weights sum to 1.
    """
    sizes_t = torch.tensor([int(s) for s in sizes], dtype=torch.long)
    weights = torch.zeros(len(sizes_t), dtype=torch.float64)
    nonempty = (sizes_t > 0).nonzero().squeeze(-1).flip(0)  # newest first
    if nonempty.numel() == 0:
        return weights.float()
    if mode == "current":
        chosen, raw = nonempty[:1], torch.ones(1, dtype=torch.float64)
    elif mode == "nearest_k":
        if k is None or k < 1:
            raise ValueError(f"nearest_k replay needs k >= 1, got {k!r}.")
        chosen = nonempty[:k]
        raw = torch.ones(len(chosen), dtype=torch.float64)
    elif mode == "all_history":
        chosen, raw = nonempty, torch.ones(len(nonempty), dtype=torch.float64)
    elif mode == "lambda_decay":
        if lam is None or not 0.0 <= lam <= 1.0:
            raise ValueError(f"lambda_decay replay needs lam in [0, 1], got {lam!r}.")
        ages = torch.arange(len(nonempty), dtype=torch.float64)
        chosen, raw = nonempty, torch.pow(torch.tensor(float(lam), dtype=torch.float64), ages)  # 0^0 = 1
    else:
        raise ValueError(f"replay mode must be one of {REPLAY_MODES}, got {mode!r}.")
    weights[chosen] = raw / raw.sum()
    return weights.float()


def replay_sample_size(configured: Optional[int], current_pairs: int, sizes: Sequence[int]) -> int:
    """Pairs to draw from the replay shards: ``configured`` when set, else this round's pair count
    when it is positive, else the newest non-empty shard's size, else 0."""
    if configured is not None:
        return int(configured)
    if current_pairs > 0:
        return int(current_pairs)
    for size in reversed(list(sizes)):
        if size > 0:
            return int(size)
    return 0


def replay_allocation(weights: torch.Tensor, sample_size: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """How many of ``sample_size`` draws go to each shard: each draw picks a shard with probability
    ``weights`` (a multinomial with replacement). ``[S] -> [S]`` long counts summing to ``sample_size``."""
    counts = torch.zeros(weights.numel(), dtype=torch.long)
    if sample_size <= 0 or float(weights.sum()) <= 0:
        return counts
    draws = torch.multinomial(weights.double(), sample_size, replacement=True, generator=generator)
    return torch.bincount(draws, minlength=weights.numel())


def shard_draw(size: int, count: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Indices of ``count`` pairs drawn from a shard of ``size`` pairs: without replacement while they
    last, i.e. ``count // size`` whole shuffled copies, then ``count % size`` distinct pairs. ``[count]`` long."""
    if count <= 0 or size <= 0:
        return torch.zeros(0, dtype=torch.long)
    parts: List[torch.Tensor] = [torch.randperm(size, generator=generator) for _ in range(count // size)]
    remainder = count % size
    if remainder:
        parts.append(torch.randperm(size, generator=generator)[:remainder])
    return torch.cat(parts)
