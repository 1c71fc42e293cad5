"""``comlrl train --dry-run``: the issue's commands resolved field by field, and every refusal before loading."""

from __future__ import annotations

import json

import pytest
import yaml

from comlrl.cli.main import main
from comlrl.runplan.plan import bundled_configs

QWEN15, QWEN17, CODER, QWEN4 = "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen3-1.7B", "Qwen/Qwen2.5-Coder-3B", "Qwen/Qwen3-4B-Instruct-2507"
HETERO = f'["{QWEN15}","{QWEN17}"]'

# The commands, with the arguments as the shell passes them on.
COMMANDS = {
    "magrpo_tldr": ["--config", "configs/magrpo_tldr_config.yaml", "--override", f"agents={HETERO}", "agent_model.name=None",
                    "magrpo.num_agents=2", "magrpo.num_turns=1", "wandb.project=hetero", "wandb.name=magrpo_tldr_1.5_1.7"],
    "maac_tldr": ["--config", "configs/maac_tldr_config.yaml", "--override", "agents=None", f"agent_model.name={QWEN17}",
                  f"critic_model.name={QWEN17}", "wandb.project=hetero", "wandb.name=maac_tldr_1.7_1.7"],
    "iac_tldr_separate": ["--config", "configs/iac_tldr_config.yaml", "--override", f"agents={HETERO}", "agent_model.name=None",
                          f"critics={HETERO}", "critic_model.name=None", "iac.use_separate_critic=true", "wandb.project=hetero",
                          "wandb.name=iac_tldr_1.5_1.7"],
    "iac_tldr_shared": ["--config", "configs/iac_tldr_config.yaml", "--override", r'agents=[\"Qwen/Qwen2.5-1.5B-Instruct\",\"Qwen/Qwen3-1.7B\"]',
                        "agent_model.name=None", "critics=None", "critic_model.name=None", "iac.use_separate_critic=false"],
    "magrpo_che": ["--config", "configs/magrpo_che_config.yaml", "--override", f'agents=["{CODER}","{QWEN4}"]', "agent_model.name=None"],
    "house_build_maac": ["--config", "house_build/configs/house_build_maac_config.yaml", "--override", f'agents=["{CODER}","{QWEN4}"]',
                         "agent_model.name=None", f"critic_model.name={QWEN4}", "seed=3"],
    "house_build_iac": ["--config", "house_build/configs/house_build_iac_config.yaml", "--override", f'agents=["{CODER}","{QWEN4}"]',
                        "agent_model.name=None", "critic_model.name=None", "iac.use_separate_critic=false", "seed=3"],
}


def dry_run(args, capsys, fmt="json"):
    extra = ["--dry-run", "--json"] if fmt == "json" else ["--dry-run"]
    assert main(["train", *args, *extra]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if fmt == "json" else yaml.safe_load(out)


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Resolution must never load a model or a tokenizer."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded during resolution")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


def test_magrpo_tldr_heterogeneous(capsys):
    d = dry_run(COMMANDS["magrpo_tldr"], capsys)
    assert (d["algorithm"], d["trainer"], d["environment"]) == ("magrpo", "MAGRPOTrainer", "tldr")
    assert d["entities"] == {"agent_model": None, "agents": [QWEN15, QWEN17], "critic_model": None, "critics": None, "num_agents": 2}
    c = d["config"]["MAGRPOConfig"]
    from comlrl.trainers.reinforce import MAGRPOConfig

    assert set(c) == set(MAGRPOConfig.field_names())  # every field of the trainer's config
    # values of OpenMLRL/LLM_Collab_Writing configs/magrpo_tldr_config.yaml; sampling from agent_model
    expected = {"num_agents": 2, "num_turns": 1, "num_train_epochs": 2, "agent_learning_rate": 5e-6, "logging_steps": 50,
                "num_generations": 4, "max_new_tokens": 256, "joint_mode": "aligned", "rollout_buffer_size": 1, "train_batch_size": 1,
                "advantage_normalization": True, "eval_interval": 20, "eval_num_samples": 4, "eval_batch_size": 1,
                "temperature": 0.7, "top_p": 0.9, "top_k": None, "parallel_training": "none", "output_dir": "output_magrpo_tldr",
                "advantage_mode": "mean", "verbose": True}
    assert {k: c[k] for k in expected} == expected
    assert d["wandb"]["project"] == "hetero" and d["wandb"]["name"] == "magrpo_tldr_1.5_1.7" and "entity" not in d["wandb"]  # no upstream organisation by default
    assert d["dataset"]["train_split"] == "train[:1100]" and d["dataset"]["eval_split"] == "test[:1100]"
    assert d["reward_processor"] == {"scale_factor": 1.0, "shift": 0.0}
    assert d["model_config"] == {"torch_dtype": "auto"}
    assert d["output"] == {"dir": "output_magrpo_tldr", "save_final_model": True, "save_path": "output_magrpo_tldr"}


def test_maac_tldr_shared_model(capsys):
    d = dry_run(COMMANDS["maac_tldr"], capsys)
    assert (d["trainer"], d["environment"]) == ("MAACTrainer", "tldr")
    assert d["entities"] == {"agent_model": QWEN17, "agents": None, "critic_model": QWEN17, "critics": None, "num_agents": 2}
    c = d["config"]["MAACConfig"]
    expected = {"num_train_epochs": 20, "agent_learning_rate": 5e-6, "critic_learning_rate": 5e-6, "value_loss_coef": 0.6,
                "rollout_buffer_size": 4, "train_batch_size": 4, "critic_type": "v", "num_turns": 1, "discount": 0.9,
                "num_generations": 1, "logging_steps": 50, "temperature": 0.7, "top_p": 0.9}
    assert {k: c[k] for k in expected} == expected
    assert d["dataset"]["train_split"] == "train[:1100]"
    assert d["model_config"] == {"torch_dtype": "auto", "critic_model_kwargs": {"torch_dtype": "auto"}}


def test_iac_tldr_separate_critics(capsys):
    d = dry_run(COMMANDS["iac_tldr_separate"], capsys)
    assert d["trainer"] == "IACTrainer"
    assert d["entities"] == {"agent_model": None, "agents": [QWEN15, QWEN17], "critic_model": None, "critics": [QWEN15, QWEN17],
                             "num_agents": 2, "use_separate_critic": True}
    c = d["config"]["IACConfig"]
    assert (c["value_clip_range"], c["num_train_epochs"], c["rollout_buffer_size"]) == (0.2, 20, 4)
    assert d["dataset"]["train_split"] == "train[:1000]"  # the IAC configs use 1000 items
    assert d["wandb"]["name"] == "iac_tldr_1.5_1.7"


def test_iac_tldr_value_heads_with_escaped_quotes(capsys):
    d = dry_run(COMMANDS["iac_tldr_shared"], capsys, fmt="yaml")
    assert d["entities"] == {"agent_model": None, "agents": [QWEN15, QWEN17], "critic_model": None, "critics": None,
                             "num_agents": 2, "use_separate_critic": False}
    assert d["config"]["IACConfig"]["use_separate_critic"] is False
    assert d["wandb"] is None  # the bundled config leaves W&B off


def test_magrpo_che(capsys):
    d = dry_run(COMMANDS["magrpo_che"], capsys)
    assert (d["environment"], d["entities"]["agents"]) == ("coophumaneval", [CODER, QWEN4])
    c = d["config"]["MAGRPOConfig"]
    expected = {"num_turns": 2, "num_train_epochs": 8, "agent_learning_rate": 2e-5, "rollout_buffer_size": 4, "train_batch_size": 4,
                "discount": 0.9, "early_termination_threshold": -0.2, "temperature": 0.6, "top_p": 0.6, "top_k": None,
                "eval_interval": 4, "eval_num_samples": 4, "external_prompt_passthrough": True}
    assert {k: c[k] for k in expected} == expected
    assert d["environment_options"] == {"external_mode": "level_feedback", "sandbox_slice": 1, "num_turns": 2, "num_agents": 2}
    assert d["reward_processor"] == {"scale_factor": 1.0, "shift": -4.0}
    assert d["dataset"]["train_split"] == "train[16:]" and d["seed"] == 42
    assert d["model_config"] == {"torch_dtype": "bfloat16"}


def test_house_build_maac(capsys):
    d = dry_run(COMMANDS["house_build_maac"], capsys)
    assert (d["trainer"], d["environment"]) == ("MAACTrainer", "housebuild")
    assert d["entities"] == {"agent_model": None, "agents": [CODER, QWEN4], "critic_model": QWEN4, "critics": None, "num_agents": 2}
    c = d["config"]["MAACConfig"]
    expected = {"num_turns": 4, "num_train_epochs": 150, "agent_learning_rate": 5e-6, "critic_learning_rate": 5e-6,
                "early_termination_threshold": 0.0, "logging_steps": 40, "max_new_tokens": 512, "discount": 0.9}
    assert {k: c[k] for k in expected} == expected
    o = d["environment_options"]
    assert (o["external_mode"], o["lim"], o["max_commands"], o["player_hp"], o["spider_num"], o["seed"]) == ("score_feedback", 20, 600, 5, 3, 3)
    assert d["reward_processor"]["shift"] == -1.0 and d["model_config"]["torch_dtype"] == "bf16"


def test_house_build_iac_value_heads(capsys):
    d = dry_run(COMMANDS["house_build_iac"], capsys)
    assert d["entities"]["use_separate_critic"] is False and d["entities"]["critic_model"] is None
    assert d["config"]["IACConfig"]["value_clip_range"] == 0.05


def test_yaml_and_json_agree(capsys):
    assert dry_run(COMMANDS["magrpo_che"], capsys, "yaml") == dry_run(COMMANDS["magrpo_che"], capsys, "json")


@pytest.mark.parametrize("name", bundled_configs())
def test_every_bundled_config_resolves(name, capsys):
    d = dry_run(["--config", name], capsys)
    assert d["algorithm"] in name and d["source"] == f"bundled:{name}"
    assert d["wandb"] is None and d["output"]["save_final_model"] is True


def test_run_directory_precedence(capsys):
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--override", "magrpo.output_dir=runs/section"], capsys)
    assert d["config"]["MAGRPOConfig"]["output_dir"] == "runs/section" == d["output"]["dir"] == d["output"]["save_path"]
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--output-dir", "runs/flag", "--override", "magrpo.output_dir=runs/section"], capsys)
    assert d["config"]["MAGRPOConfig"]["output_dir"] == "runs/flag" == d["output"]["save_path"]
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--override", "output.save_path=elsewhere"], capsys)
    assert (d["output"]["dir"], d["output"]["save_path"]) == ("output_magrpo_tldr", "elsewhere")


def test_algorithm_variants_read_the_magrpo_section(capsys):
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--algorithm", "marloo"], capsys)
    assert d["trainer"] == "MARLOOTrainer" and d["config"]["MARLOOConfig"]["advantage_mode"] == "rloo"
    assert d["config"]["MARLOOConfig"]["num_generations"] == 4


# ----------------------------------------------------------------------------- refusals, naming the key

REFUSALS = [
    (["magrpo.num_generation=4"], r"magrpo\.num_generation \(did you mean magrpo\.num_generations\?\)"),
    (["modle.name=x"], r"modle"),
    (["dataset.splitt=x"], r"dataset\.splitt"),
    (["external.mode=plain"], r"external\.mode"),  # TLDR has no feedback modes
    (["magrpo.num_generations=four"], r"magrpo\.num_generations must be an integer"),
    (["magrpo.advantage_normalization=yes"], r"magrpo\.advantage_normalization must be true or false"),
    (["agent_model.temperature=hot"], r"agent_model\.temperature must be a number"),
    (["magrpo.num_generations=1"], r"num_generations must be an integer >= 2"),
    (["agents=Qwen/A"], r"agents must be a list"),
    (["agent_model.name=None"], r"agent_model\.name .*agents"),
    (['agents=["A","B"]'], r"agent_model\.name and agents conflict"),
    (['agents=["A","B","C"]', "agent_model.name=None", "magrpo.num_agents=3"], r"tldr environment takes 1 or 2 agents but agents gives 3"),
    (['agents=["A","B"]', "agent_model.name=None", "magrpo.num_agents=3"], r"magrpo\.num_agents is 3 but agents lists 2"),
    (["critic_model.name=Qwen/C"], r"magrpo trains no critic, but critic_model\.name is set"),
    (["tokenizer.padding_side=right"], r"tokenizer\.padding_side"),
    (["seed=abc"], r"seed must be an integer"),
    (["reward_processor.scale_factor=big"], r"reward_processor\.scale_factor"),
]


@pytest.mark.parametrize("overrides, message", REFUSALS)
def test_refusals_name_the_key(overrides, message, capsys):
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--override", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("comlrl train: error:")
    import re

    assert re.search(message, err), err


AC_REFUSALS = [
    ("iac_tldr_config.yaml", ["iac.use_separate_critic=false"], r"critic_model\.name is set but iac\.use_separate_critic=false"),
    ("iac_tldr_config.yaml", ["critic_model.name=None"], r"iac needs a critic"),
    ("iac_tldr_config.yaml", ['critics=["A"]', "critic_model.name=None"], r"critics lists 1 models but iac needs 2"),
    ("maac_tldr_config.yaml", ['critics=["A","B"]', "critic_model.name=None"], r"critics lists 2 models but maac needs 1"),
    ("maac_tldr_config.yaml", ["critic_model.name=None"], r"maac needs a critic"),
    ("maac_tldr_config.yaml", ['critics=["B"]'], r"critic_model\.name and critics conflict"),
    ("magrpo_he_config.yaml", ["external.mode=bogus"], r"external\.mode"),
    ("magrpo_he_config.yaml", ["external.sandbox_slice=few"], r"sandbox_slice"),
    ("house_build_magrpo_config.yaml", ["task.spider.num=-1"], r"spider_num"),
    ("house_build_magrpo_config.yaml", ["task.spiders=3"], r"task\.spiders"),
    ("str_build_magrpo_config.yaml", ["magrpo.num_turns=0"], r"num_turns must be an integer >= 1"),
    ("maac_he_config.yaml", ["maac.num_generations=0"], r"num_generations must be an integer >= 1"),
    # the single-agent baselines
    ("grpo_tldr_config.yaml", ["grpo.num_agents=2"], r"grpo\.num_agents is 2 but grpo trains 1 agent"),
    ("grpo_tldr_config.yaml", ['agents=["A","B"]', "agent_model.name=None"], r"grpo trains 1 agent .* but agents lists 2 models"),
    ("ac_he_config.yaml", ["critic_model.name=None"], r"ac needs a critic"),
    ("ac_he_config.yaml", ['critics=["A","B"]', "critic_model.name=None"], r"critics lists 2 models but ac needs 1"),
    ("grpo_tldr_config.yaml", ["critic_model.name=Qwen/C"], r"grpo trains no critic"),
    ("str_build_magrpo_config.yaml", ["magrpo.num_agents=1"], r"strbuild environment takes 2 agents but magrpo\.num_agents gives 1"),
]


@pytest.mark.parametrize("config, overrides, message", AC_REFUSALS)
def test_entity_and_environment_refusals(config, overrides, message, capsys):
    import re

    assert main(["train", "--config", config, "--override", *overrides]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_older_layout_and_unknown_config(capsys, tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  name: x\nmagrpo: {}\n")
    assert main(["train", "--config", str(old)]) == 2
    assert "rename it to 'agent_model'" in capsys.readouterr().err
    assert main(["train", "--config", "magrpo_tdlr_config.yaml"]) == 2
    assert "Did you mean magrpo_tldr_config.yaml" in capsys.readouterr().err
    both = tmp_path / "both.yaml"
    both.write_text("agent_model: {name: x}\ndataset: {type: tldr}\nmagrpo: {}\nmaac: {}\n")
    assert main(["train", "--config", str(both)]) == 2
    assert "--algorithm" in capsys.readouterr().err


def test_comlrl_configs_lists_and_prints(capsys):
    assert main(["configs"]) == 0
    listing = capsys.readouterr().out
    for name in ("magrpo_tldr_config.yaml", "maac_tldr_config.yaml", "iac_tldr_config.yaml", "magrpo_che_config.yaml",
                 "house_build_maac_config.yaml", "str_build_iac_config.yaml", "maac_mbpp_config.yaml", "iac_arxiv_config.yaml"):
        assert name in listing
    assert main(["configs", "house_build_maac_config.yaml"]) == 0
    assert "maac:" in capsys.readouterr().out
