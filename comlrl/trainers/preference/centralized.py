"""Centralized adapters: one model writes every agent's output from one joint prompt.

An adapter has two methods:

- ``build_prompt(batch_item, agent_prompts) -> str``: the joint prompt from the agents' own prompts;
- ``parse_completion(completion, batch_item, num_agents) -> Sequence[str]``: exactly ``num_agents``
  strings, one per agent, or ``CentralizedComparatorParseError`` when the text has no usable structure.

``TaggedCentralizedComparatorAdapter`` (the default) asks for ``<agent_1> ... </agent_1>``,
``<agent_2> ... </agent_2>``, ... sections and reads them back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Protocol, Sequence, runtime_checkable


class CentralizedComparatorParseError(ValueError):
    """A joint completion could not be split into the agents' outputs."""


@runtime_checkable
class CentralizedComparatorAdapter(Protocol):
    def build_prompt(self, batch_item: Any, agent_prompts: Sequence[str]) -> str: ...

    def parse_completion(self, completion: str, batch_item: Any, num_agents: int) -> Sequence[str]: ...


def _tag(index: int) -> "re.Pattern[str]":
    return re.compile(rf"<\s*agent_{index}\s*>(.*?)<\s*/\s*agent_{index}\s*>", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """Joint prompt with each agent's original prompt, answered in ``<agent_i>`` sections (1-based)."""

    def build_prompt(self, batch_item: Any, agent_prompts: Sequence[str]) -> str:
        count = len(agent_prompts)
        lines = [
            f"You are a centralized coordinator writing the separate outputs of {count} agents that work together "
            f"on one task. Each agent has its own instructions, given below.",
            "",
        ]
        for index, prompt in enumerate(agent_prompts, start=1):
            lines += [f"Agent {index} original prompt:", prompt, ""]
        sections = " ".join(f"<agent_{i}>...</agent_{i}>" for i in range(1, count + 1))
        lines.append(f"Write each agent's output in its own section, in this order: {sections}")
        return "\n".join(lines)

    def parse_completion(self, completion: str, batch_item: Any, num_agents: int) -> List[str]:
        outputs, found = [], False
        for index in range(1, num_agents + 1):
            match = _tag(index).search(completion)
            found = found or match is not None
            outputs.append(match.group(1).strip() if match else "")
        if not found:
            raise CentralizedComparatorParseError(
                f"the joint completion has none of the sections <agent_1> ... <agent_{num_agents}>: {completion[:80]!r}"
            )
        return outputs


def check_adapter(adapter: Any) -> Any:
    """Refuse an adapter without callable ``build_prompt`` and ``parse_completion``."""
    for name in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, name, None)):
            raise TypeError(
                f"centralized_comparator_adapter must have callable build_prompt(batch_item, agent_prompts) and "
                f"parse_completion(completion, batch_item, num_agents); {type(adapter).__name__} has no {name}."
            )
    return adapter


def joint_prompt(adapter: Any, item: Any, agent_prompts: Sequence[str]) -> str:
    """``adapter.build_prompt`` checked to return a non-empty string."""
    prompt = adapter.build_prompt(item, list(agent_prompts))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"centralized adapter build_prompt must return a non-empty str, got {prompt!r}.")
    return prompt


def split_completion(adapter: Any, completion: str, item: Any, num_agents: int) -> List[str]:
    """The agents' outputs in ``completion``; a parse error gives ``num_agents`` empty strings."""
    try:
        parts = adapter.parse_completion(completion, item, num_agents)
    except CentralizedComparatorParseError:
        return [""] * num_agents
    if isinstance(parts, (str, bytes)):
        raise TypeError(f"parse_completion must return a sequence of {num_agents} strings, got a single {type(parts).__name__}.")
    parts = list(parts)
    if len(parts) != num_agents:
        raise ValueError(f"parse_completion returned {len(parts)} outputs for {num_agents} agents.")
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"parse_completion must return strings, got {type(part).__name__}.")
    return parts
