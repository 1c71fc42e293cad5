"""The reward-function calling convention, output checks and reward processors."""

import functools
import math

import numpy as np
import pytest
import torch

from comlrl.rollout.rewards import RewardFunctionError, RewardFunction, call_reward_function
from comlrl.rollout.reward_processors import RewardProcessors

LISTS = [["a", "bb"], ["ccc", "dddd"]]


def test_one_positional_list_per_agent_and_batch_items():
    seen = {}

    def reward(completions1, completions2, batch_items=None):
        seen.update(c1=completions1, c2=completions2, items=batch_items)
        return [len(a) + len(b) for a, b in zip(completions1, completions2)]

    assert RewardFunction(reward, 2).score(LISTS, ["p0", "p1"], {"prompt": "x"}) == [4.0, 6.0]
    assert seen == {"c1": ["a", "bb"], "c2": ["ccc", "dddd"], "items": [{"prompt": "x"}]}


def test_prompts_first_and_prompts_keyword():
    def prompts_first(prompts, c1, c2):
        return [float(len(prompts))] * len(c1)

    def prompts_keyword(c1, c2, prompts=None):
        return [float(prompts == ["p0", "p1"])] * len(c1)

    assert RewardFunction(prompts_first, 2).score(LISTS, ["p0", "p1"], {}) == [2.0, 2.0]
    assert RewardFunction(prompts_keyword, 2).score(LISTS, ["p0", "p1"], {}) == [1.0, 1.0]


def test_single_parameter_for_two_agents_is_refused():
    def reward(completions):
        return [len(completions[0][j]) * 10 + len(completions[1][j]) for j in range(2)]

    with pytest.raises(ValueError, match=r"f\(completions_0, completions_1, batch_items=None\)"):
        RewardFunction(reward, 2)


def test_var_positional_and_partial_with_bound_keywords():
    def ratio(c1, c2, target=2.0):
        return [target * len(b) / len(a) for a, b in zip(c1, c2)]

    assert RewardFunction(functools.partial(ratio, target=1.0), 2).score(LISTS, None, {}) == [3.0, 2.0]
    assert RewardFunction(lambda *lists: [len(lists)] * 2, 2).score(LISTS, None, {}) == [2.0, 2.0]


def test_output_types_are_normalised():
    for output in (torch.tensor([1.0, 2.0]), np.array([1.0, 2.0]), (1, 2), [np.float32(1), torch.tensor(2.0)]):
        assert RewardFunction(lambda a, b, out=output: out, 2).score(LISTS, None, {}) == [1.0, 2.0]


@pytest.mark.parametrize(
    "output, message",
    [
        ([1.0, float("nan")], "returned nan as value 1; rewards must be finite"),
        ([1.0, math.inf], "rewards must be finite"),
        (["good", "bad"], r"returned 'good' \(str\) as value 0"),
        ([1.0, 2.0, 3.0], "returned 3 values for 2 joint responses"),
        (None, "returned NoneType"),
        ({"a": 1}, "returned dict"),
        ([True, False], r"returned True \(bool\)"),
    ],
)
def test_bad_outputs_raise(output, message):
    with pytest.raises(ValueError, match=message):
        RewardFunction(lambda a, b: output, 2).score(LISTS, None, {})


def test_one_value_for_several_responses_switches_to_one_call_per_response():
    calls = []

    def reward(c1, c2):  # written for one joint response per call, as CoMLRL 1.4.3 MAGRPO called it
        calls.append((list(c1), list(c2)))
        return [float(len(c2[0]) - len(c1[0]))]

    fn = RewardFunction(reward, 2)
    with pytest.warns(UserWarning, match="now called once per joint response"):
        assert fn.score(LISTS, None, {}) == [2.0, 2.0]
    assert calls[1:] == [(["a"], ["ccc"]), (["bb"], ["dddd"])]
    assert fn.score(LISTS, None, {}) == [2.0, 2.0]  # stays in per-response mode without a new warning


def test_incompatible_signature_is_refused_at_construction():
    with pytest.raises(ValueError, match="cannot take the completions of 2 agent"):
        RewardFunction(lambda a, b, c: [0.0], 2)
    with pytest.raises(ValueError, match="reward_func must be a callable"):
        RewardFunction(None, 2)
    with pytest.raises(ValueError, match="reward_processor must be a callable"):
        RewardFunction(lambda a, b: [0.0], 2, processor=3)


def test_errors_inside_the_function_name_it_the_row_and_the_team_and_keep_the_cause():
    def reward(c1, c2):
        raise TypeError("bug inside the reward")

    with pytest.raises(RewardFunctionError) as info:
        RewardFunction(reward, 2).score(LISTS, None, {"prompt": "p7"})
    message = str(info.value)
    assert "reward_func" in message and "test_errors_inside_the_function_name_it" in message and "<locals>.reward" in message
    assert "raised TypeError: bug inside the reward" in message and "test_reward_convention.py:" in message
    assert "of 2 agent(s)" in message and "{'prompt': 'p7'}" in message
    assert isinstance(info.value.__cause__, TypeError) and isinstance(info.value, ValueError)


def test_builtin_without_signature_is_called_blind():
    # max(*lists) has no inspectable signature; it is called as f(*lists, batch_items=...) first
    class Opaque:
        __signature__ = None

        def __call__(self, *args, **kwargs):
            if kwargs:
                raise TypeError("no keywords")
            return [float(len(args))] * 2

    fn = RewardFunction(Opaque(), 2)
    fn._signature = None  # behave like a C function
    assert fn.call_raw(LISTS, None, [{}]) == [2.0, 2.0]


def test_processor_applies_to_every_value_and_is_checked():
    fn = RewardFunction(lambda a, b: [1.0, 2.0], 2, processor=RewardProcessors.scale(10.0))
    assert fn.score(LISTS, None, {}) == [10.0, 20.0]
    bad = RewardFunction(lambda a, b: [1.0, 2.0], 2, processor=lambda x: float("nan"))
    with pytest.raises(ValueError, match="rewards must be finite"):
        bad.score(LISTS, None, {})


def test_reward_processors():
    assert RewardProcessors.scale(3.0)(2.0) == 6.0
    assert RewardProcessors.shift(-4.0)(1.0) == -3.0
    assert RewardProcessors.clip(0.0, 1.0)(5.0) == 1.0
    assert RewardProcessors.compose([RewardProcessors.shift(1.0), RewardProcessors.scale(2.0)])(1.0) == 4.0
    assert RewardProcessors.identity()(7) == 7.0
    with pytest.raises(ValueError, match="clip needs low <= high"):
        RewardProcessors.clip(2.0, 1.0)


def test_call_reward_function_compat_helper():
    out = call_reward_function(lambda c1, c2: torch.tensor([0.5, 1.5]), ["p"], LISTS, num_agents=2, batch_items=[{}])
    assert out == [0.5, 1.5]
