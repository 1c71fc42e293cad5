"""The reward-function calling convention.

A reward function receives one list of completions per agent, in actor order and index-aligned (the
j-th entries form joint response j), optionally ``batch_items`` (the dataset items) and ``prompts``,
and returns one number per joint response. How the lists are passed is read from its signature:

- ``f(completions_0, ..., completions_{N-1}, ...)``: one positional list per agent (the default);
- ``f(prompts, completions_0, ...)``: when the first positional parameter is named ``prompts``;
- ``*args``: one list per agent.

A function that cannot take one positional list per agent (``f(completions)`` for two agents, say)
is refused when the trainer is built, before any model loads, with the signature it needs; it is
never called with another shape in the hope that the counts work out. ``batch_items=`` and
``prompts=`` are passed as keywords when the function names them (or takes ``**kwargs``). Functions
without an inspectable signature are called as ``f(*lists, batch_items=...)``, then ``f(*lists)``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from comlrl.rollout.rows import callable_name, describe_rows, raised_at


class RewardFunctionError(ValueError):
    """The user's reward function raised: the message names it, the rows and the team it scored."""


def _describe(func: Callable) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


@dataclass(frozen=True)
class _CallPlan:
    prompts_positional: bool
    pass_batch_items: bool
    pass_prompts: bool


def _plan_call(signature: inspect.Signature) -> List[_CallPlan]:
    """Candidate ways to call a function with this signature, most natural first (whether it binds the
    lists of N agents is checked by binding them: ``RewardFunction._choose_plan``)."""
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params}
    takes_items = "batch_items" in names or var_kw
    takes_prompts = "prompts" in names or var_kw
    prompts_first = bool(positional) and positional[0].name == "prompts"
    plans = []
    if prompts_first:
        plans.append(_CallPlan(True, takes_items, False))
    plans.append(_CallPlan(False, takes_items, takes_prompts))
    return plans


def needed_signature(num_agents: int) -> str:
    """The reward signature for ``num_agents`` agents, e.g. ``f(completions_0, completions_1, batch_items=None)``."""
    return "f(" + ", ".join(f"completions_{i}" for i in range(num_agents)) + ", batch_items=None)"


def _arguments(plan: _CallPlan, lists, prompts, batch_items):
    args: list = [prompts] if plan.prompts_positional else []
    args.extend(lists)
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


def _values(count: int) -> str:
    return f"{count} value" + ("" if count == 1 else "s")


def _responses(count: int) -> str:
    return f"{count} joint response" + ("" if count == 1 else "s")


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
        self._plans = _plan_call(self._signature) if self._signature is not None else None
        self._plan: Optional[_CallPlan] = None
        if self._signature is not None:  # refuse an incompatible signature before any model loads
            self._plan = self._choose_plan([[""] for _ in range(num_agents)], [""] * num_agents, [{}])

    # ------------------------------------------------------------------ raw calls
    def call_raw(self, lists: Sequence[Sequence[str]], prompts: Optional[Sequence[str]], batch_items: Optional[Sequence[Any]]) -> List[float]:
        """Call the function once and return its values, unprocessed and unchecked in length."""
        return normalize_reward_output(self.call(lists, prompts, batch_items), self.func)

    def call(self, lists: Sequence[Sequence[str]], prompts: Optional[Sequence[str]], batch_items: Optional[Sequence[Any]]) -> Any:
        """Call the function once and return whatever it returned."""
        lists = [list(x) for x in lists]
        if self._signature is not None and self._plan is None:
            self._plan = self._choose_plan(lists, prompts, batch_items)
        try:
            if self._signature is None:
                return self._call_blind(lists, batch_items)
            args, kwargs = _arguments(self._plan, lists, list(prompts) if prompts is not None else None, batch_items)
            return self.func(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the user's function: name it, the rows and the team
            count = len(lists[0]) if lists else 0
            raise RewardFunctionError(
                f"reward_func {callable_name(self.func)} raised {type(error).__name__}: {error}{raised_at(error)} while scoring "
                f"{_responses(count)} of {self.num_agents} agent(s) on {describe_rows(batch_items)}. It is called as "
                f"{needed_signature(self.num_agents)} with one list of completion strings per agent; fix the function "
                f"(or that row)."
            ) from error

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
            f"of {self.num_agents} agent(s): it is called with one positional list of strings per agent. Define it "
            f"as {needed_signature(self.num_agents)}, returning one float per joint response (entry j of every "
            f"list is joint response j)."
        )

    def _call_blind(self, lists, batch_items):
        attempts = []
        if batch_items is not None:
            attempts.append(lambda: self.func(*lists, batch_items=batch_items))
        attempts.append(lambda: self.func(*lists))
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
        first: Optional[str] = None  # what the batched call returned, when it turned out to score one response per call
        if not self.per_response:
            values = self.call_raw(lists, prompts, items)
            if len(values) == count:
                return values
            if len(values) != 1 or count == 1:
                raise ValueError(
                    f"reward_func {_describe(self.func)!r} returned {_values(len(values))} for {_responses(count)}; "
                    f"it must return exactly one number per joint response (entry j of every agent's list)."
                )
            warnings.warn(
                f"reward_func {_describe(self.func)!r} returned one value for {count} joint responses; it is "
                f"now called once per joint response. Return one value per entry of the completion lists to "
                f"score them in one call.",
                stacklevel=2,
            )
            self.per_response = True
            first = f"called with {_responses(count)} it returned 1 value, "
        values = []
        for j in range(count):
            single = self.call_raw([[agent_list[j]] for agent_list in lists], prompts, items)
            if len(single) != 1:
                raise ValueError(
                    f"reward_func {_describe(self.func)!r} does not return one number per joint response: "
                    f"{first or ''}called with 1 joint response it returned {_values(len(single))}. Return a list "
                    f"with one float per entry of the completion lists."
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
