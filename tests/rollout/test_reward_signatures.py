"""The reward calling convention is checked when the trainer is built, not guessed from the counts."""

import pytest

from comlrl.rollout.rewards import RewardFunction
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def one_list(completions):
    return [float(len(c)) for c in completions]


def test_the_refusal_comes_before_any_model_loads(monkeypatch):
    import comlrl.trainers.reinforce.magrpo as magrpo

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(magrpo, "load_agents", no_loading)
    with pytest.raises(ValueError, match=r"f\(completions_0, completions_1, batch_items=None\)"):
        MAGRPOTrainer(agents=["/nonexistent/a", "/nonexistent/b"], reward_func=one_list, args=MAGRPOConfig(num_turns=1))


def test_per_agent_lists_var_positional_and_prompts_first_still_bind():
    assert RewardFunction(lambda a, b: [1.0] * len(a), 2).score([["x", "y"], ["z", "w"]], None, {}) == [1.0, 1.0]
    assert RewardFunction(lambda *lists: [float(len(lists))] * 2, 2).score([["x", "y"], ["z", "w"]], None, {}) == [2.0, 2.0]
    assert RewardFunction(lambda prompts, a, b: [0.5] * len(a), 2).score([["x"], ["z"]], ["p"], {}) == [0.5]
    # one agent: one list, one parameter
    assert RewardFunction(one_list, 1).score([["ab", "c"]], None, {}) == [2.0, 1.0]


def test_too_few_values_report_the_actual_numbers():
    def short(a, b):
        return [1.0] * (len(a) - 1)

    with pytest.warns(UserWarning, match="returned one value for 2 joint responses"):
        with pytest.raises(ValueError) as info:
            RewardFunction(short, 2).score([["x", "y"], ["z", "w"]], None, {})
    message = str(info.value)
    assert "called with 2 joint responses it returned 1 value" in message
    assert "called with 1 joint response it returned 0 values" in message


def test_a_wrong_count_names_both_numbers():
    with pytest.raises(ValueError, match="returned 2 values for 3 joint responses"):
        RewardFunction(lambda a, b: [0.0, 1.0], 2).score([["a", "b", "c"], ["d", "e", "f"]], None, {})
