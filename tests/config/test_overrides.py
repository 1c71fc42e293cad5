"""Override parsing: the syntax of the task repositories' commands, as the shell hands it over."""

from __future__ import annotations

import pytest

from comlrl.runplan.overrides import apply_overrides, as_text, parse_override, parse_overrides, parse_value

# (text after the shell, parsed key, parsed value)
TABLE = [
    # the commands, after the shell removed one level of quotes
    ('agents=["Qwen/Qwen2.5-1.5B-Instruct","Qwen/Qwen3-1.7B"]', "agents", ["Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen3-1.7B"]),
    # pasted from the published notes: the single quotes keep the backslashes
    (r'agents=[\"Qwen/Qwen2.5-1.5B-Instruct\",\"Qwen/Qwen3-1.7B\"]', "agents", ["Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen3-1.7B"]),
    (r"agents=[\'A\', \'B\']", "agents", ["A", "B"]),
    ("agent_model.name=None", "agent_model.name", None),
    ("agent_model.name=null", "agent_model.name", None),
    ("agent_model.name=NULL", "agent_model.name", None),
    ("critics=~", "critics", None),
    ("agent_model.name=Qwen/Qwen3-1.7B", "agent_model.name", "Qwen/Qwen3-1.7B"),
    ('agent_model.name="Qwen/Qwen3-1.7B"', "agent_model.name", "Qwen/Qwen3-1.7B"),
    ("magrpo.num_agents=2", "magrpo.num_agents", 2),
    ("magrpo.num_turns=1", "magrpo.num_turns", 1),
    ("iac.use_separate_critic=true", "iac.use_separate_critic", True),
    ("iac.use_separate_critic=false", "iac.use_separate_critic", False),
    ("iac.use_separate_critic=True", "iac.use_separate_critic", True),
    ("iac.use_separate_critic=FALSE", "iac.use_separate_critic", False),
    ("wandb.project=hetero", "wandb.project", "hetero"),
    ("wandb.name=magrpo_tldr_1.5_1.7", "wandb.name", "magrpo_tldr_1.5_1.7"),
    ("wandb.name='magrpo_tldr_1.5_1.7'", "wandb.name", "magrpo_tldr_1.5_1.7"),
    ("magrpo.agent_learning_rate=5e-6", "magrpo.agent_learning_rate", 5e-6),
    ("magrpo.agent_learning_rate=2.0e-5", "magrpo.agent_learning_rate", 2e-5),
    ("magrpo.early_termination_threshold=-0.2", "magrpo.early_termination_threshold", -0.2),
    ("magrpo.agent_devices=['cuda:0']", "magrpo.agent_devices", ["cuda:0"]),
    ("magrpo.agent_devices=[cuda:0, cuda:1]", "magrpo.agent_devices", ["cuda:0", "cuda:1"]),
    ("task.player={'hp': 7}", "task.player", {"hp": 7}),
    ("magrpo.adam_betas=(0.9, 0.95)", "magrpo.adam_betas", (0.9, 0.95)),
    ("dataset.train_split=train[:1100]", "dataset.train_split", "train[:1100]"),
    ("dataset.train_split=[:8]", "dataset.train_split", "[:8]"),
    ("external.sandbox_slice=all", "external.sandbox_slice", "all"),
    ("wandb.tags=[magrpo, tldr]", "wandb.tags", ["magrpo", "tldr"]),
    ("output.base_dir=runs/a=b", "output.base_dir", "runs/a=b"),  # only the first '=' splits
    ("wandb.notes=", "wandb.notes", ""),
    ("wandb.name= spaced ", "wandb.name", "spaced"),
]


@pytest.mark.parametrize("text, key, value", TABLE)
def test_override_table(text, key, value):
    override = parse_override(text)
    assert override.key == key
    assert override.value == value and type(override.value) is type(value)


@pytest.mark.parametrize("text", ["no_equals_sign", "=value", "agents..x=1", "1bad=2", "a-b=3", " =x"])
def test_malformed_overrides_are_refused(text):
    with pytest.raises(ValueError, match="key"):
        parse_override(text)


def test_raw_text_is_kept_for_string_fields():
    override = parse_override("wandb.name=1.50")
    assert override.value == 1.5 and as_text(override.value, override.raw) == "1.50"
    assert as_text(1, "'1'") == "1" and as_text("x", "x") == "x"


def test_apply_creates_sections_and_refuses_keys_inside_values():
    config = {"critic_model": None, "agents": ["a", "b"], "magrpo": {"num_turns": 2}}
    out = apply_overrides(config, [parse_override("critic_model.name=x"), parse_override("magrpo.num_turns=1"),
                                   parse_override("new.section.key=3")])
    assert out["critic_model"] == {"name": "x"} and out["magrpo"] == {"num_turns": 1}
    assert out["new"] == {"section": {"key": 3}}
    with pytest.raises(ValueError, match="agents is list"):
        apply_overrides(config, [parse_override("agents.name=x")])


def test_apply_sets_in_order_but_the_command_line_refuses_a_key_twice():
    out = apply_overrides({}, [parse_override("wandb.name=a"), parse_override("wandb.name=b")])
    assert out == {"wandb": {"name": "b"}}
    with pytest.raises(ValueError, match=r"--override sets wandb.name twice, to a and to b; only one can hold .* Keep one"):
        parse_overrides(["wandb.name=a", "seed=1", "wandb.name=b"])
    with pytest.raises(ValueError, match=r"the section agent_model=\{'name': 'y'\} and the key agent_model.name=x"):
        parse_overrides(["agent_model.name=x", "agent_model={'name': 'y'}"])
    assert [o.key for o in parse_overrides(["seed=1", "seed=1", "magrpo.num_turns=1"])] == ["seed", "seed", "magrpo.num_turns"]


@pytest.mark.parametrize("raw, value", [("[1, 2", "[1, 2"), ("{a: [1}", "{a: [1}"), ("x" * 5000, "x" * 5000)])
def test_unparsable_values_stay_text(raw, value):
    assert parse_value(raw) == value
