"""What a new user reads: no internal issue numbers, every config example sets num_turns (its
default stays 1.4.3's 2), the quick start needs no hub as pasted, and the multi-turn error names
num_turns=1 as the fix."""

from __future__ import annotations

import glob
import os
import re

import pytest
from tests.helpers.common import REPO_ROOT

ROOT = REPO_ROOT
USER_DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
NOT_TRAINER_CONFIGS = {"LoraConfig", "GenerationConfig", "AutoConfig", "LlamaConfig"}


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        return handle.read()


def config_calls(text: str):
    """Every ``SomethingConfig(...)`` call in the python blocks and inline code of a document."""
    snippets = re.findall(r"```python\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]*Config\([^`\n]*)`", text)
    for snippet in snippets:
        for match in re.finditer(r"\b(\w+Config)\(", snippet):
            if match.group(1) in NOT_TRAINER_CONFIGS:
                continue
            depth, end = 1, match.end()
            while depth and end < len(snippet):
                depth += {"(": 1, ")": -1}.get(snippet[end], 0)
                end += 1
            yield snippet[match.start():end]


@pytest.mark.parametrize("name", USER_DOCS)
def test_no_internal_issue_numbers(name):
    assert re.findall(r"\bissues? ?#?\d+|\bissue-\d+", read(name), flags=re.I) == []


@pytest.mark.parametrize("name", USER_DOCS)
def test_every_config_example_sets_num_turns(name):
    missing = [call for call in config_calls(read(name)) if "num_turns" not in call]
    assert missing == []


def test_the_quick_start_uses_the_embedded_model_as_pasted():
    text = read("README.md")
    block = text[text.index("## Quick start"):].split("```python\n", 1)[1].split("```", 1)[0]
    assert "USE_HUB = False" in block and "BRIEF_MODEL = DETAILED_MODEL = default_model_dir()" in block


def test_num_turns_keeps_its_default_and_the_error_names_the_fix(monkeypatch):
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    assert MAGRPOConfig().num_turns == 2  # CoMLRL 1.4.3's default: code written for it keeps its meaning
    with pytest.raises(ValueError) as info:
        MAGRPOTrainer(agents=["/x/a", "/x/b"], reward_func=lambda a, b: [0.0] * len(a), args=MAGRPOConfig())
    message = str(info.value)
    assert "set num_turns=1 in MAGRPOConfig(...)" in message and "num_turns defaults to 2, as in CoMLRL 1.4.3" in message
