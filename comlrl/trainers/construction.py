"""The steps the trainer families' constructors share, written once.

CoMLRL 1.4.x gave the three families different constructor signatures, and they stay exactly as
they were (tests/trainers/test_public_signatures.py): MAGRPO's order with ``num_agents``, ``eval_logger``
and ``eval_aggregator``; the actor-critic order with ``critic_model``, ``metrics_callback`` and
``critics``; MADPO's, MAGRPO's without ``peft_config`` plus a keyword-only comparator adapter. What
each constructor does with the keywords they share is here: the team (how many agents, from which
sources, with which tokenizers) and the task (one formatter per agent, the reward function with its
processor), both checked before any model loads.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from comlrl.models.entities import AgentPlan, agent_count, plan_agents
from comlrl.rollout.formatters import build_formatters, check_prompt_rows
from comlrl.rollout.prompt_check import PromptCheck
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.rows import as_dataset


def resolve_config(args: Any, family: type, default_cls: type, defaults: Optional[Dict[str, Any]] = None) -> Any:
    """The config a trainer runs with: a private copy of ``args`` (or ``default_cls()``), with the
    algorithm's ``defaults`` applied to the fields the caller did not set (a plain ``MAGRPOConfig``
    given to ``MARLOOTrainer`` takes the leave-one-out baseline unless ``advantage_mode`` was set)."""
    if args is None:
        return default_cls()
    if not isinstance(args, family):
        raise TypeError(f"args must be a {family.__name__} (or a subclass), got {type(args).__name__}.")
    config = copy.copy(args)
    for name, value in (defaults or {}).items():
        if not config.is_explicit(name) and not isinstance(config, default_cls):
            setattr(config, name, value)
    return config


def plan_team(args: Any, agent_model: Any, agents: Any, num_agents: Optional[int], tokenizer: Any) -> Tuple[int, AgentPlan]:
    """The team size (also written to ``args.num_agents``) and the plan of where each agent and its
    tokenizer come from."""
    count = agent_count(agent_model, agents, num_agents, args)
    args.num_agents = count
    return count, plan_agents(agent_model=agent_model, agents=agents, count=count, tokenizer=tokenizer)


@dataclass
class Task:
    """What the agents are trained on: one formatter per agent, the reward (``reward_func`` with its
    processor), the transition between turns, the datasets, and the check that every row's prompt
    fits its agent's context (``prompt_check``, run by ``load_agents`` before any model loads)."""

    formatters: List[Any]
    reward: RewardFunction
    reward_func: Any
    reward_processor: Any
    external_transition: Any
    train_dataset: Any
    eval_dataset: Any
    prompt_check: PromptCheck

    def user_callbacks(self) -> Dict[str, Any]:
        """The user's objects a checkpoint keeps the state of (when they offer one)."""
        callbacks = {"reward_func": self.reward_func, "reward_processor": self.reward_processor,
                     "external_transition": self.external_transition}
        callbacks.update({f"formatters.{i}": formatter.original for i, formatter in enumerate(self.formatters)})
        return callbacks


def bind_task(count: int, *, formatters: Any, train_dataset: Any, eval_dataset: Any, reward_func: Any, reward_processor: Any,
              external_transition: Any, pass_none_external_prompts: bool, max_new_tokens: int) -> Task:
    """The task of ``count`` agents: one formatter per agent (the datasets' rows must hold what they
    read), ``reward_func`` with ``reward_processor``, and the datasets as the trainer keeps them (a
    pandas DataFrame becomes a ``datasets.Dataset``)."""
    datasets = {"train_dataset": as_dataset(train_dataset, "train_dataset"), "eval_dataset": as_dataset(eval_dataset, "eval_dataset")}
    built = build_formatters(formatters, count, pass_none_external_prompts=pass_none_external_prompts)
    check_prompt_rows(datasets, formatters)
    reward = RewardFunction(reward_func, count, reward_processor)
    return Task(built, reward, reward_func, reward_processor, external_transition, datasets["train_dataset"], datasets["eval_dataset"],
                PromptCheck(datasets, built, max_new_tokens))


def check_transition(args: Any, transition: Any, family: str) -> None:
    """Multi-turn training needs a callable ``external_transition`` (checked before anything loads)."""
    if transition is not None and not callable(transition):
        raise ValueError(f"external_transition must be callable, got {type(transition).__name__}.")
    if args.num_turns > 1 and transition is None:
        default = "" if args.is_explicit("num_turns") else f"; num_turns defaults to {args.num_turns}, as in CoMLRL 1.4.3"
        raise ValueError(
            f"Multi-turn {family} requires an external_transition (num_turns={args.num_turns}{default}): for single-turn "
            f"training set num_turns=1 in {type(args).__name__}(...), or give external_transition=f returning the next "
            f"turn's prompt of every agent."
        )
