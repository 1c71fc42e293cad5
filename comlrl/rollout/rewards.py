"""The reward-function calling convention.

A reward function receives one list of completions per agent, in actor order and index-aligned (the
j-th entries form joint response j), optionally ``batch_items`` (the dataset items) and ``prompts``,
and returns one number per joint response. How the lists are passed is read from its signature:

- ``f(completions_0, ..., completions_{N-1}, ...)``: one positional list per agent (the default);
- ``f(prompts, completions_0, ...)``: when the first positional parameter is named ``prompts``;
- ``f(completions)`` with one required positional parameter and N > 1 agents: the list of lists;
- ``*args``: one list per agent.

``batch_items=`` and ``prompts=`` are passed as keywords when the function names them (or takes
``**kwargs``). Functions without an inspectable signature are tried as ``f(*lists, batch_items=...)``,
``f(*lists)``, then ``f(lists)``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch


def _describe(func: Callable) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


@dataclass(frozen=True)
class _CallPlan:
    prompts_positional: bool
    list_of_lists: bool
    pass_batch_items: bool
    pass_prompts: bool


def _plan_call(signature: inspect.Signature, num_agents: int) -> List[_CallPlan]:
    """Candidate ways to call a function with this signature, most natural first."""
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    names = {p.name for p in params}
    takes_items = "batch_items" in names or var_kw
    takes_prompts = "prompts" in names or var_kw
    required = [p for p in positional if p.default is p.empty and p.name not in ("batch_items", "prompts")]
    prompts_first = bool(positional) and positional[0].name == "prompts"
    plans = []
    if prompts_first:
        plans.append(_CallPlan(True, False, takes_items, False))
    if num_agents > 1 and len(required) == 1 and not var_pos and not prompts_first:
        plans.append(_CallPlan(False, True, takes_items, takes_prompts))
    plans.append(_CallPlan(False, False, takes_items, takes_prompts))
    plans.append(_CallPlan(False, True, takes_items, takes_prompts))
    return plans


def _arguments(plan: _CallPlan, lists, prompts, batch_items):
    args: list = [prompts] if plan.prompts_positional else []
    args.extend([lists] if plan.list_of_lists else lists)
    kwargs = {}
    if plan.pass_batch_items and batch_items is not None:
        kwargs["batch_items"] = batch_items
    if plan.pass_prompts and prompts is not None:
        kwargs["prompts"] = prompts
    return args, kwargs


def _to_float(value: Any, func: Callable, index: int) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"reward_func {_describe(func)!r} returned a tensor of shape {tuple(value.shape)} as value {index}.")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        try:
            import numpy as np

            if isinstance(value, np.generic) and np.issubdtype(type(value), np.number):
                value = value.item()
            else:
                raise TypeError
        except TypeError:
            raise ValueError(
                f"reward_func {_describe(func)!r} returned {value!r} ({type(value).__name__}) as value {index}; "
                f"every reward must be a real number."
            ) from None
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"reward_func {_describe(func)!r} returned {number} as value {index}; rewards must be finite.")
    return number


def normalize_reward_output(result: Any, func: Callable) -> List[float]:
    """A reward function's output as a list of finite floats (tensor, array, sequence or scalar)."""
    if isinstance(result, torch.Tensor):
        values = result.detach().reshape(-1).tolist()
    elif hasattr(result, "tolist") and not isinstance(result, (str, bytes)):
        values = result.tolist()
        values = values if isinstance(values, list) else [values]
    elif isinstance(result, (list, tuple)):
        values = list(result)
    elif result is None or isinstance(result, (str, bytes, dict)):
        raise ValueError(
            f"reward_func {_describe(func)!r} returned {type(result).__name__}; it must return one number per "
            f"joint response (a list, a tensor, or a single number)."
        )
    else:
        values = [result]
    return [_to_float(v, func, i) for i, v in enumerate(values)]


class RewardFunction:
    """The user's reward function bound to the calling convention, with a reward processor."""

    def __init__(self, func: Callable, num_agents: int, processor: Optional[Callable[[float], float]] = None):
        if func is None or not callable(func):
            raise ValueError(
                f"reward_func must be a callable that scores joint responses, got {func!r}."
            )
        if processor is not None and not callable(processor):
            raise ValueError(f"reward_processor must be a callable float -> float, got {processor!r}.")
        self.func = func
        self.num_agents = num_agents
        self.processor = processor
        self.per_response = False  # set when the function turns out to score one joint response per call
        try:
            self._signature: Optional[inspect.Signature] = inspect.signature(func)
        except (TypeError, ValueError):
            self._signature = None
        self._plans = _plan_call(self._signature, num_agents) if self._signature is not None else None
        self._plan: Optional[_CallPlan] = None
        if self._signature is not None:  # refuse an incompatible signature before any model loads
            self._plan = self._choose_plan([[""] for _ in range(num_agents)], [""] * num_agents, [{}])

    def signature_hint(self) -> str:
        """When the function takes one argument for several agents, how it is called and how to define
        it instead (appended to count errors, which are then about its signature); else ""."""
        if self._plan is None or not self._plan.list_of_lists or self.num_agents < 2:
            return ""
        n = self.num_agents
        return (
            f" Its signature {self._signature} has one positional parameter for {n} agents, so it is called with "
            f"a single argument: the list of the {n} agents' completion lists (completions[i][j] is agent i's "
            f"part of joint response j). Define it with one parameter per agent, "
            f"f(completions_0, ..., completions_{n - 1}, batch_items=None), each a list of strings, or read "
            f"completions[i][j] and return one number per j."
        )

    # ------------------------------------------------------------------ raw calls
    def call_raw(self, lists: Sequence[Sequence[str]], prompts: Optional[Sequence[str]], batch_items: Optional[Sequence[Any]]) -> List[float]:
        """Call the function once and return its values, unprocessed and unchecked in length."""
        return normalize_reward_output(self.call(lists, prompts, batch_items), self.func)

    def call(self, lists: Sequence[Sequence[str]], prompts: Optional[Sequence[str]], batch_items: Optional[Sequence[Any]]) -> Any:
        """Call the function once and return whatever it returned."""
        lists = [list(x) for x in lists]
        if self._signature is None:
            return self._call_blind(lists, batch_items)
        if self._plan is None:
            self._plan = self._choose_plan(lists, prompts, batch_items)
        args, kwargs = _arguments(self._plan, lists, list(prompts) if prompts is not None else None, batch_items)
        return self.func(*args, **kwargs)

    def _choose_plan(self, lists, prompts, batch_items) -> _CallPlan:
        for plan in self._plans:
            args, kwargs = _arguments(plan, lists, prompts, batch_items)
            try:
                self._signature.bind(*args, **kwargs)
            except TypeError:
                continue
            return plan
        raise ValueError(
            f"reward_func {_describe(self.func)!r} with signature {self._signature} cannot take the completions "
            f"of {self.num_agents} agent(s). Define it as f(completions_0, ..., completions_{self.num_agents - 1}, "
            f"batch_items=None) with one list of strings per agent, returning one float per joint response."
        )

    def _call_blind(self, lists, batch_items):
        attempts = []
        if batch_items is not None:
            attempts.append(lambda: self.func(*lists, batch_items=batch_items))
        attempts += [lambda: self.func(*lists), lambda: self.func(lists)]
        first_error: Optional[TypeError] = None
        for attempt in attempts:
            try:
                return attempt()
            except TypeError as exc:
                first_error = first_error or exc
        raise first_error  # type: ignore[misc]

    # ------------------------------------------------------------------ scoring
    def score(self, lists: Sequence[Sequence[str]], prompts: Optional[Sequence[str]], item: Any) -> List[float]:
        """Processed rewards of the J joint responses ``(lists[0][j], ..., lists[N-1][j])``."""
        return self.process(self.score_raw(lists, prompts, item))

    def score_raw(self, lists: Sequence[Sequence[str]], prompts: Optional[Sequence[str]], item: Any) -> List[float]:
        """The function's own values for the J joint responses, before ``reward_processor``.

        The function is called once for all J responses. A function written for one joint response
        per call (it returns a single value for J > 1) is detected on its first call and from then on
        called once per joint response, with a warning.
        """
        if len(lists) != self.num_agents:
            raise ValueError(f"expected completions of {self.num_agents} agents, got {len(lists)}.")
        count = len(lists[0])
        items = [item]
        if not self.per_response:
            values = self.call_raw(lists, prompts, items)
            if len(values) == count:
                return values
            if len(values) != 1 or count == 1:
                raise ValueError(
                    f"reward_func {_describe(self.func)!r} returned {len(values)} values for {count} joint "
                    f"responses; it must return exactly one number per joint response.{self.signature_hint()}"
                )
            warnings.warn(
                f"reward_func {_describe(self.func)!r} returned one value for {count} joint responses; it is "
                f"now called once per joint response. Return one value per entry of the completion lists to "
                f"score them in one call.",
                stacklevel=2,
            )
            self.per_response = True
        values = []
        for j in range(count):
            single = self.call_raw([[agent_list[j]] for agent_list in lists], prompts, items)
            if len(single) != 1:
                raise ValueError(
                    f"reward_func {_describe(self.func)!r} returned {len(single)} values for 1 joint response."
                )
            values.extend(single)
        return values

    def process(self, values: List[float]) -> List[float]:
        """``reward_processor`` applied to every value (checked to stay a finite number)."""
        if self.processor is None:
            return values
        out = []
        for index, value in enumerate(values):
            processed = self.processor(value)
            out.append(_to_float(processed, self.processor, index))
        return out


def resolve_reward_range(reward_func: Callable[..., Any]) -> Optional[Tuple[float, float]]:
    """The ``reward_range`` declared on ``reward_func`` (or on what a ``functools.partial`` wraps), else None."""
    for candidate in (reward_func, getattr(reward_func, "func", None)):
        declared = getattr(candidate, "reward_range", None)
        if declared is not None:
            return checked_reward_range(declared, reward_func)
    return None


def checked_reward_range(value: Any, reward_func: Any) -> Tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"reward_range of {reward_func!r} must be two numbers (min, max), got {value!r}.") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise ValueError(f"reward_range must be two finite numbers with min < max, got {value!r}.")
    return low, high


def call_reward_function(
    reward_func: Callable,
    prompts: Optional[Sequence[str]],
    agent_completions: Sequence[Sequence[str]],
    *,
    num_agents: int,
    batch_items: Optional[Sequence[Any]] = None,
    signature: Any = None,
) -> List[float]:
    """Call ``reward_func`` once with the convention above and return its values as floats."""
    del signature  # the signature is always read from the function itself
    return RewardFunction(reward_func, num_agents).call_raw(agent_completions, prompts, batch_items)


# ----------------------------------------------------------------------------- CoMLRL 1.4.x helpers (comlrl.utils)


def set_reward_range(reward_func: Callable[..., Any], minimum: float, maximum: float) -> Callable[..., Any]:
    """Attach ``reward_range = (minimum, maximum)`` to ``reward_func`` (two finite numbers, min < max)."""
    low, high = checked_reward_range((minimum, maximum), reward_func)
    reward_func.reward_range = (low, high)
    return reward_func


def normalize_reward_lengths(rewards: Sequence[float], *, num_agents: int, num_generations: int, algorithm: str) -> List[float]:
    """Check a per-prompt reward list of an actor-critic trainer: 1 value (shared), N (one per
    agent) or K (one per generation) values; a single agent passes through."""
    values = [float(r) for r in rewards]
    if num_agents == 1 or len(values) in (1, num_agents, num_generations):
        return values
    raise ValueError(
        f"Reward function must return 1 value, {num_generations} (one per generation) or {num_agents} "
        f"(one per agent) values per prompt for multi-agent {algorithm}; got {len(values)}."
    )
