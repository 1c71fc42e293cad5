"""Config fields are refused for their type before their range: bools must be bools, numbers numbers."""

from __future__ import annotations

import dataclasses

import pytest

from comlrl.trainers.actor_critic import IACConfig, MAACConfig
from comlrl.trainers.preference import MADPOConfig, MARLHFConfig
from comlrl.trainers.preference.iterative_config import MADPOIterConfig
from comlrl.trainers.reinforce import MAGRPOConfig

CONFIGS = [MAGRPOConfig, IACConfig, MAACConfig, MADPOConfig, MARLHFConfig, MADPOIterConfig]


def bool_fields(cls):
    return [f.name for f in dataclasses.fields(cls) if f.type in ("bool", "Optional[bool]")]


@pytest.mark.parametrize("value, meant", [("no", False), ("false", False), ("yes", True), ("True", True)])
def test_verbose_as_text_is_refused_with_the_bool_to_write(value, meant):
    with pytest.raises(ValueError) as info:
        MAGRPOConfig(verbose=value)
    message = str(info.value)
    assert message.startswith("verbose must be True, False or None.")
    assert repr(value) in message and f"write verbose={meant}" in message


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_bool_field_of_every_config_refuses_text_and_integers(cls):
    names = bool_fields(cls)
    assert "verbose" in names and "tensorboard" in names  # the common fields are seen
    for name in names:
        for value in ("no", 1):
            with pytest.raises(ValueError, match=rf"^{name} must be True(, False or None| or False)\. Got (the str |the int )?{value!r}"):
                cls(num_turns=1, **{name: value})


def test_bools_and_none_where_optional_pass():
    config = MAGRPOConfig(verbose=None, tensorboard=False, overwrite_output_dir=True, optimizer_fused=None)
    assert config.verbose is None and config.overwrite_output_dir is True


@pytest.mark.parametrize("field, value, fix", [
    ("agent_learning_rate", "1e-5", "agent_learning_rate=1e-05"),
    ("agent_learning_rate", "-1e-5", "agent_learning_rate=-1e-05"),
    ("top_p", "0.9", "top_p=0.9"),
    ("max_grad_norm", "1", "max_grad_norm=1.0"),
    ("num_generations", "4", "num_generations=4"),
])
def test_a_number_given_as_text_is_blamed_for_its_type_not_its_sign(field, value, fix):
    with pytest.raises(ValueError) as info:
        MAGRPOConfig(**{field: value})
    message = str(info.value)
    assert f"Got the str {value!r}" in message and "without quotes" in message and fix in message
    assert ">= 0" not in message


def test_a_negative_learning_rate_is_still_blamed_for_its_sign():
    with pytest.raises(ValueError, match=r"agent_learning_rate must be >= 0.0\. Got -1e-05\."):
        MAGRPOConfig(agent_learning_rate=-1e-5)


def test_a_non_numeric_text_and_a_bool_name_their_type():
    with pytest.raises(ValueError, match=r"agent_learning_rate must be a number\. Got the str 'fast'\.$"):
        MAGRPOConfig(agent_learning_rate="fast")
    with pytest.raises(ValueError, match=r"temperature must be a number in \(0.0, inf\]\. Got True, a bool\."):
        MAGRPOConfig(temperature=True)
