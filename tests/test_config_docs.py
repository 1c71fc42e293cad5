"""Config fields are documented where users look (help(), docs/configs.md) and config mistakes are
named with the fix: misspelt keywords get a suggestion, non-integer counts say "an integer"."""

from __future__ import annotations

import dataclasses
import os
import pydoc
import subprocess
import sys

import pytest

from comlrl.trainers.actor_critic import IACConfig, MAACConfig
from comlrl.trainers.config_base import ConfigFieldError
from comlrl.trainers.field_docs import describe
from comlrl.trainers.reinforce import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig, IACConfig, MAACConfig]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_help_shows_every_field_with_its_description(config):
    text = pydoc.render_doc(config, renderer=pydoc.plaintext)
    records = describe(config)
    assert list(records) == [f.name for f in dataclasses.fields(config)]  # every field, in constructor order
    for record in records.values():
        assert record.description, f"{config.__name__}.{record.name} has no docstring"
        assert f"{record.name}: {record.annotation} = {record.default}" in text
        first_words = " ".join(record.description.split()[:6])
        assert first_words in " ".join(text.split()), f"help() lacks the description of {record.name}"


def test_descriptions_come_from_the_field_docstrings():
    records = describe(MAGRPOConfig)
    assert records["num_generations"].description == "K: completions each agent samples per prompt (the group of the baseline)."
    assert records["num_generations"].default == "4" and records["num_generations"].annotation == "int"
    # A subclass that only changes a default keeps the base's description and shows its own default.
    assert describe(MAREINFORCEConfig)["advantage_mode"].default == "'raw'"
    assert describe(MAREINFORCEConfig)["advantage_mode"].description == records["advantage_mode"].description
    assert describe(IACConfig)["num_generations"].default == "1"  # redefined by the actor-critic fields


def test_committed_config_reference_is_current():
    # Regenerate the page in a subprocess (the generator imports every trainer module) and compare.
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_config_docs.py"), "--check"],
                            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr + "\nrun: python tools/gen_config_docs.py"
    with open(os.path.join(ROOT, "docs", "configs.md"), encoding="utf-8") as handle:
        page = handle.read()
    for config in CONFIGS:
        assert f"## {config.__name__}" in page
    assert "| `num_generations` | `int` | `4` | K: completions each agent samples per prompt" in page
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        assert "docs/configs.md" in handle.read()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_misspelt_keyword_suggests_the_field(config):
    with pytest.raises(TypeError, match=r"'num_generation' \(did you mean 'num_generations'\?\)"):
        config(num_generation=4)
    with pytest.raises(ValueError, match="did you mean 'agent_learning_rate'"):
        config(agent_learnig_rate=1e-5)  # a ValueError too, like every other config mistake
    with pytest.raises(ConfigFieldError, match="did you mean 'logging_steps'") as info:
        config.from_dict({"loging_steps": 1}, section="magrpo")
    assert "in section 'magrpo'" in str(info.value)


@pytest.mark.parametrize("value", [4.0, "4", True, 1])
def test_num_generations_must_be_an_integer_of_at_least_two(value):
    with pytest.raises(ValueError, match=r"num_generations must be an integer >= 2 .*Got " + repr(value).replace("'", ".")):
        MAGRPOConfig(num_generations=value)
    assert MAGRPOConfig(num_generations=2).num_generations == 2


def test_integer_fields_name_the_type():
    with pytest.raises(ValueError, match=r"rollout_buffer_size must be an integer >= 1\. Got 2\.0\."):
        MAGRPOConfig(rollout_buffer_size=2.0)
    with pytest.raises(ValueError, match=r"update_epochs must be an integer >= 1\. Got 0\."):
        IACConfig(update_epochs=0)
