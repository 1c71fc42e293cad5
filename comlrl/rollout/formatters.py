"""Formatters: one callable per agent that turns a dataset item into that agent's prompt."""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Mapping, Optional, Sequence


def _accepts_keyword(func: Callable, name: str) -> bool:
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def default_formatter(item: Mapping[str, Any], external_prompts: Optional[str] = None) -> str:
    """The item's ``"prompt"`` field, or the transition's prompt for later turns."""
    if external_prompts is not None:
        return external_prompts
    return item.get("prompt", "") if isinstance(item, Mapping) else ""


class Formatter:
    """Calls a user formatter with ``(item)`` or ``(item, external_prompts=...)`` and checks the result."""

    def __init__(self, func: Callable, index: int, *, pass_none_external_prompts: bool):
        self.original = func
        self.index = index
        self._takes_external = _accepts_keyword(func, "external_prompts")
        self._pass_none = pass_none_external_prompts

    def __call__(self, item: Any, external_prompts: Optional[str] = None) -> str:
        if self._takes_external and (external_prompts is not None or self._pass_none):
            prompt = self.original(item, external_prompts=external_prompts)
        else:
            prompt = self.original(item)
        if not isinstance(prompt, str):
            raise ValueError(
                f"formatters[{self.index}] must return the prompt as a str, got {type(prompt).__name__}."
            )
        return prompt

    def __repr__(self) -> str:
        return f"Formatter({self.original!r})"


def build_formatters(formatters: Any, num_agents: int, *, pass_none_external_prompts: bool = True) -> List[Formatter]:
    """One ``Formatter`` per agent from None (the item's "prompt"), one callable, or a list of them."""
    if formatters is None:
        funcs: Sequence[Callable] = [default_formatter] * num_agents
    elif callable(formatters):
        funcs = [formatters] * num_agents
    elif isinstance(formatters, (list, tuple)):
        if len(formatters) != num_agents:
            raise ValueError(
                f"Number of formatters must match num_agents: got {len(formatters)} formatters for {num_agents} "
                f"agents. Give one formatter per agent, or a single callable to share."
            )
        for index, func in enumerate(formatters):
            if not callable(func):
                raise ValueError(f"formatters[{index}] must be callable, got {type(func).__name__}.")
        funcs = list(formatters)
    else:
        raise ValueError(
            f"formatters must be None, a callable or a list of callables (one per agent), got {type(formatters).__name__}."
        )
    return [Formatter(f, i, pass_none_external_prompts=pass_none_external_prompts) for i, f in enumerate(funcs)]
