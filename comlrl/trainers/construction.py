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

from typing import Any, Optional, Tuple

from comlrl.models.entities import AgentPlan, agent_count, plan_agents
from comlrl.rollout.formatters import build_formatters, check_prompt_rows
from comlrl.rollout.prompt_check import PromptCheck
from comlrl.rollout.rewards import RewardFunction
from comlrl.rollout.rows import as_dataset


def plan_team(args: Any, agent_model: Any, agents: Any, num_agents: Optional[int], tokenizer: Any) -> Tuple[int, AgentPlan]:
    """The team size (also written to ``args.num_agents``) and the plan of where each agent and its
    tokenizer come from."""
    count = agent_count(agent_model, agents, num_agents, args)
    args.num_agents = count
    return count, plan_agents(agent_model=agent_model, agents=agents, count=count, tokenizer=tokenizer)


def bind_task(trainer: Any, count: int, *, formatters: Any, train_dataset: Any, eval_dataset: Any, reward_func: Any,
              reward_processor: Any, pass_none_external_prompts: bool, max_new_tokens: int) -> Tuple[Any, Any]:
    """Set ``trainer.formatters`` (one per agent; the datasets' rows must hold what they read),
    ``trainer.reward`` (``reward_func`` with ``reward_processor``, for ``count`` agents) and
    ``trainer.prompt_check`` (every row's prompt fits its agent: ``load_agents(check_prompts=...)`` runs it
    before any model loads). Returns the datasets as the trainer keeps them (a pandas DataFrame
    becomes a ``datasets.Dataset``)."""
    datasets = {"train_dataset": as_dataset(train_dataset, "train_dataset"), "eval_dataset": as_dataset(eval_dataset, "eval_dataset")}
    trainer.formatters = build_formatters(formatters, count, pass_none_external_prompts=pass_none_external_prompts)
    check_prompt_rows(datasets, formatters)
    trainer.reward = RewardFunction(reward_func, count, reward_processor)
    trainer.prompt_check = PromptCheck(datasets, trainer.formatters, max_new_tokens)
    return datasets["train_dataset"], datasets["eval_dataset"]
