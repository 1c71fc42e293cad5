"""Returns of rollout trees, per-agent credit in cross mode, and one-step TD targets."""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def node_returns(
    rewards: torch.Tensor,
    child_mean_returns: Optional[torch.Tensor],
    discount: float,
) -> torch.Tensor:
    """Returns of the J joint actions of one tree node.

    ``G_j = r_j + gamma * mean(G of the children of j)`` where j expanded (the child node's returns
    are averaged over its own joint actions), and ``G_j = r_j`` where it did not (a leaf, the last
    turn, or an early-terminated branch).

    Args:
        rewards: ``[J]`` immediate rewards.
        child_mean_returns: ``[J]`` mean return of each child node, ``nan`` where j has no child;
            None when no joint action expanded.
        discount: gamma in [0, 1].
    Returns:
        ``[J]`` returns.
    """
    if child_mean_returns is None:
        return rewards.clone()
    bootstrap = torch.where(torch.isnan(child_mean_returns), torch.zeros_like(rewards), child_mean_returns)
    return rewards + discount * bootstrap


def cross_marginal_returns(joint_returns: torch.Tensor, num_agents: int, k: int) -> torch.Tensor:
    """Per-agent credit of each completion in cross mode.

    In cross mode the J = K^N joint actions of a node are the Cartesian product of the agents'
    K completions, in ``itertools.product`` order (the last agent varies fastest). The credit of
    completion c of agent i is the mean return of the K^(N-1) joint actions that contain it:
    ``Q_i(c) = mean_{a : a_i = c} G(a)`` (a Monte-Carlo estimate of the agent's action value).

    Args:
        joint_returns: ``[K^N]``.
    Returns:
        ``[N, K]``: row i holds the K credits of agent i.
    """
    if joint_returns.numel() != k**num_agents:
        raise ValueError(f"cross mode expects K^N = {k ** num_agents} joint returns, got {joint_returns.numel()}.")
    grid = joint_returns.reshape((k,) * num_agents)
    rows = []
    for agent in range(num_agents):
        other = tuple(d for d in range(num_agents) if d != agent)
        rows.append(grid.mean(dim=other) if other else grid)
    return torch.stack(rows)


def rewards_to_go(rewards: Sequence[float], discount: float) -> list[float]:
    """Discounted reward-to-go ``G_t = sum_{u >= t} gamma^(u-t) r_u`` of one trajectory."""
    out: list[float] = []
    running = 0.0
    for reward in reversed(list(rewards)):
        running = float(reward) + discount * running
        out.append(running)
    return out[::-1]


def td_targets(
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    terminal: torch.Tensor,
    discount: float,
) -> torch.Tensor:
    """One-step TD targets ``y_t = r_t + gamma * V(h_{t+1})``, without bootstrap at terminal turns.

    Args:
        rewards: ``[T]``.
        next_values: ``[T]`` value of the next turn's history (ignored where terminal).
        terminal: ``[T]`` bool, True for the last turn or an early-terminated one.
        discount: gamma.
    Returns:
        ``[T]`` targets; the TD error is ``y_t - V(h_t)``.
    """
    bootstrap = torch.where(terminal, torch.zeros_like(next_values), next_values)
    return rewards + discount * bootstrap
