"""The algorithm registry (``comlrl.trainers.registry``) and the environment registry (``comlrl.envs``):
the built-in records, a user's own algorithm and environment through ``comlrl train --dry-run`` and
``comlrl estimate``, and the refusals."""

from __future__ import annotations

import inspect
import json
import os
import re
from types import SimpleNamespace

import pytest

import comlrl.envs.base as envs_base
from comlrl.cli.main import main
from comlrl.envs import Environment, TaskOptions, get_environment, list_environments, register_environment
from comlrl.trainers import registry
from comlrl.trainers.registry import ALGORITHMS, FAMILIES, register_algorithm, register_family
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from tests.helpers.common import REPO_ROOT

ROOT = REPO_ROOT


class MyGRPOConfig(MAGRPOConfig):
    """A user's own config (the MAGRPO fields)."""


class MyGRPOTrainer(MAGRPOTrainer):
    """A user's own trainer with MAGRPO's constructor."""


@pytest.fixture(autouse=True)
def clean_registries():
    """Every test leaves the registries as it found them."""
    algorithms, families, environments = dict(ALGORITHMS), dict(FAMILIES), dict(envs_base._REGISTRY)
    yield
    for table, saved in ((ALGORITHMS, algorithms), (FAMILIES, families), (envs_base._REGISTRY, environments)):
        table.clear()
        table.update(saved)


def dry_run(argv, capsys):
    assert main(["train", *argv, "--dry-run", "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- algorithms


def test_builtin_records_are_the_algorithms_comlrl_train_knows():
    assert list(ALGORITHMS) == ["magrpo", "mareinforce", "marloo", "maremax", "iac", "maac", "madpo", "marlhf",
                                "madpo_iter", "marlhf_iter", "grpo", "ac"]
    # the estimator's models, formerly a table of their own in comlrl/cli/main.py
    assert {name: a.estimator for name, a in ALGORITHMS.items() if a.estimator} == {
        "magrpo": "magrpo", "mareinforce": "magrpo", "marloo": "magrpo", "maremax": "magrpo", "grpo": "magrpo",
        "iac": "iac", "ac": "iac", "maac": "maac", "madpo": "madpo", "marlhf": "marlhf"}
    for algorithm in ALGORITHMS.values():
        trainer, config = algorithm.trainer_class(), algorithm.config_class()
        assert trainer.__name__ == algorithm.trainer_name and trainer.__name__.endswith("Trainer")
        assert config.__name__ == trainer.__name__.replace("Trainer", "Config")
        assert algorithm.family in FAMILIES and algorithm.sections[0] == algorithm.name
    assert (ALGORITHMS["grpo"].agents, ALGORITHMS["ac"].agents) == (1, 1)


@pytest.mark.parametrize("family, names", [("reinforce", ["magrpo", "marloo"]), ("actor_critic", ["iac", "maac"]),
                                           ("preference", ["madpo", "marlhf", "madpo_iter"])])
def test_family_builders_give_only_keywords_their_trainers_take(family, names):
    entities = {"agent_model": "A", "agents": None, "critic_model": "C", "critics": None}
    env = SimpleNamespace(reward_func=print, formatters=[str, str], external_transition=None)
    rows = SimpleNamespace(eval_logger=None, eval_aggregator=None, metrics_callback=None)
    parts = registry.TrainerParts(env, entities, None, [], None, None, None, rows)
    for name in names:
        algorithm = ALGORITHMS[name]
        config = SimpleNamespace(rl_algorithm="iac") if name == "marlhf" else SimpleNamespace()  # MARLHF with an IAC phase
        plan = SimpleNamespace(algorithm=algorithm, config=config, model_config={})
        kwargs = algorithm.trainer_kwargs(plan, parts)
        parameters = inspect.signature(algorithm.trainer_class().__init__).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):  # MARLHF passes **kwargs on to its engines
            assert set(kwargs) <= set(parameters), f"{name}: {sorted(set(kwargs) - set(parameters))}"
        assert kwargs["reward_func"] is print and kwargs["agent_model"] == "A"
        if family == "preference":  # only an actor-critic RL phase takes the critics
            assert ("critic_model" in kwargs) == (name == "marlhf")


def test_a_users_algorithm_is_one_call_and_comlrl_train_runs_it(capsys):
    record = register_algorithm("my_grpo", trainer=MyGRPOTrainer, config=MyGRPOConfig, family="reinforce",
                                sections=("my_grpo", "magrpo"), estimator="magrpo")
    assert ALGORITHMS["my_grpo"] is record and record.trainer_class() is MyGRPOTrainer
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--algorithm", "my_grpo", "--override", "magrpo.num_generations=3"], capsys)
    assert (d["algorithm"], d["trainer"], d["environment"]) == ("my_grpo", "MyGRPOTrainer", "tldr")
    assert d["config"]["MyGRPOConfig"]["num_generations"] == 3  # read from the magrpo section it falls back to
    base = dry_run(["--config", "magrpo_tldr_config.yaml", "--override", "magrpo.num_generations=3"], capsys)
    assert d["config"]["MyGRPOConfig"] == {**base["config"]["MAGRPOConfig"], "output_dir": d["output"]["dir"]}
    # its own section is a known section of a config, chosen by its name
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--algorithm", "my_grpo", "--override", "my_grpo.num_turns=1",
                 "my_grpo.num_generations=5"], capsys)
    assert d["config"]["MyGRPOConfig"]["num_generations"] == 5


def test_the_estimator_reads_the_record(capsys):
    register_algorithm("my_grpo", trainer=MyGRPOTrainer, config=MyGRPOConfig, family="reinforce",
                       sections=("my_grpo", "magrpo"), estimator="magrpo")
    register_algorithm("my_unmodelled", trainer=MyGRPOTrainer, config=MyGRPOConfig, family="reinforce",
                       sections=("my_unmodelled", "magrpo"))
    assert main(["estimate", "--config", "magrpo_tldr_config.yaml"]) == 0, capsys.readouterr().err
    expected = capsys.readouterr().out
    assert main(["estimate", "--config", "magrpo_tldr_config.yaml", "--override", "algorithm=my_grpo"]) == 0
    assert capsys.readouterr().out == expected and "predicted peak" in expected
    assert main(["estimate", "--config", "magrpo_tldr_config.yaml", "--override", "algorithm=my_unmodelled"]) == 2
    assert "my_unmodelled is not modelled yet" in capsys.readouterr().err


def test_the_estimator_models_the_preference_records(capsys):
    # MADPO and MARLHF name their own estimator models; the iterative ones (comparators, replay) do not
    assert (ALGORITHMS["madpo"].estimator, ALGORITHMS["marlhf"].estimator) == ("madpo", "marlhf")
    assert ALGORITHMS["madpo_iter"].estimator is None and ALGORITHMS["marlhf_iter"].estimator is None
    assert main(["estimate", "--config", "madpo_iter_che_config.yaml", "--override", "algorithm=madpo"]) == 0, capsys.readouterr().err
    assert "predicted peak" in capsys.readouterr().out
    assert main(["estimate", "--config", "madpo_iter_che_config.yaml"]) == 2
    assert "madpo_iter is not modelled yet" in capsys.readouterr().err


def test_run_shape_refuses_a_name_it_does_not_model():
    from comlrl.cli.memory import PUBLISHED_MODELS, run_shape

    shape = PUBLISHED_MODELS["qwen3-1.7b"]
    with pytest.raises(ValueError, match=r"algorithm='mareinforce' is not modelled by the estimator; use one of magrpo, iac, maac"):
        run_shape("mareinforce", [shape, shape], MAGRPOConfig())


def test_an_algorithm_registered_in_an_imported_module(tmp_path, capsys):
    plugin = tmp_path / "my_algorithms.py"
    plugin.write_text(
        "from comlrl.trainers.registry import register_algorithm\n"
        "register_algorithm('team_loo', trainer='comlrl.trainers.reinforce:MARLOOTrainer',\n"
        "                   config='comlrl.trainers.reinforce:MARLOOConfig', family='reinforce', sections=('team_loo', 'magrpo'))\n"
    )
    d = dry_run(["--config", "magrpo_tldr_config.yaml", "--import", str(plugin), "--algorithm", "team_loo"], capsys)
    assert (d["algorithm"], d["trainer"]) == ("team_loo", "MARLOOTrainer") and "MARLOOConfig" in d["config"]
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--import", str(tmp_path / "missing.py"), "--dry-run"]) == 2
    assert "--import" in capsys.readouterr().err
    assert main(["train", "--config", "magrpo_tldr_config.yaml", "--import", "no_such_module_here", "--dry-run"]) == 2
    assert "no module named 'no_such_module_here'" in capsys.readouterr().err


def test_a_new_family_brings_its_keyword_builder():
    def build(plan, parts):
        return {"task": parts.env, "settings": plan.config}

    register_family("my_family", build)
    record = register_algorithm("odd", trainer=MyGRPOTrainer, config=MyGRPOConfig, family="my_family")
    assert record.sections == ("odd",)
    assert record.trainer_kwargs(SimpleNamespace(config="cfg"), SimpleNamespace(env="env")) == {"task": "env", "settings": "cfg"}
    with pytest.raises(ValueError, match="the family 'my_family' is already registered"):
        register_family("my_family", build)
    with pytest.raises(ValueError, match="build=3 must be a function"):
        register_family("other", 3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="magrpo"), r"an algorithm named 'magrpo' is already registered \(MAGRPOTrainer\); choose another name, or pass replace=True"),
    (dict(name="My GRPO"), r"name='My GRPO' must be a non-empty lower-case string"),
    (dict(family="bandit"), r"family='bandit' is not a trainer family; use one of reinforce, actor_critic, preference, or register"),
    (dict(trainer="comlrl.trainers.reinforce.MAGRPOTrainer"), r"trainer='comlrl.trainers.reinforce.MAGRPOTrainer' must be a class or a 'module:Class'"),
    (dict(config=3), r"config=3 must be a class or a 'module:Class' string"),
    (dict(agents=0), r"agents=0 must be a positive team size"),
    (dict(sections=()), r"sections=\(\) must be one or more YAML section names"),
    (dict(estimator=""), r"estimator='' must name a model of the memory estimator"),
])
def test_register_algorithm_refusals_name_the_argument(kwargs, message):
    arguments = {**dict(name="mine", trainer=MyGRPOTrainer, config=MyGRPOConfig, family="reinforce"), **kwargs}
    with pytest.raises(ValueError, match=message):
        register_algorithm(arguments.pop("name"), **arguments)
    assert "mine" not in ALGORITHMS


def test_replace_true_replaces_a_record(capsys):
    register_algorithm("magrpo", trainer=MyGRPOTrainer, config=MyGRPOConfig, family="reinforce", replace=True, estimator="magrpo")
    assert dry_run(["--config", "magrpo_tldr_config.yaml"], capsys)["trainer"] == "MyGRPOTrainer"


# ----------------------------------------------------------------------------- environments


def docs_section():
    with open(os.path.join(ROOT, "docs", "environments.md"), encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(r"^## Your own environment$(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match, "docs/environments.md lost its '## Your own environment' section"
    (python,) = re.findall(r"```python\n(.*?)```", match.group(1), flags=re.S)
    (config,) = re.findall(r"```yaml\n(.*?)```", match.group(1), flags=re.S)
    return python, config


def test_the_documented_environment_registers_and_comlrl_train_runs_it(tmp_path, capsys, monkeypatch):
    python, config = docs_section()
    assert len(python.strip().splitlines()) <= 16  # the docs promise a short example
    (tmp_path / "echo_env.py").write_text(python)
    (tmp_path / "echo.yaml").write_text(config)
    monkeypatch.chdir(tmp_path)
    assert "echo" not in list_environments()
    d = dry_run(["--config", "echo.yaml", "--import", "echo_env.py"], capsys)
    assert (d["environment"], d["algorithm"]) == ("echo", "magrpo")
    assert d["environment_options"] == {"num_turns": 1, "num_agents": 2}
    assert "echo" in list_environments() and list_environments() == sorted(list_environments())
    env = get_environment("echo")
    rows = env.load_dataset("train", limit=2)
    assert [f(rows[0]) for f in env.formatters] == ["Say cat once.", "Say cat twice."]
    assert env.reward_func(["cat", "owl owl"], ["cat cat", "owl"]) == [1.0, 0.0]
    assert env.reward_details(["cat"], ["cat cat"]) == [{"reward": 1.0}]  # the default breakdown
    with pytest.raises(ValueError, match="num_agents must be 2 for the echo environment, got 3"):
        get_environment("echo", num_agents=3)


def _build(options):
    return Environment(name="tiny", num_agents=options.num_agents, num_turns=options.num_turns, options=options,
                       formatters=[str, str], reward_func=lambda a, b, batch_items=None: [0.0] * len(a),
                       loader=lambda split, **_: [])


def test_duplicate_and_bad_environment_registrations_are_refused():
    with pytest.raises(ValueError, match=r"the environment name 'tldr' is already registered; choose another name, or pass replace=True"):
        register_environment("tldr", _build)
    with pytest.raises(ValueError, match=r"the environment name 'he' is an alias of 'humaneval'"):
        register_environment("he", _build)
    with pytest.raises(ValueError, match=r"name='Tiny' must be a non-empty lower-case string"):
        register_environment("Tiny", _build)
    with pytest.raises(ValueError, match=r"factory=3 must be a function build\(options\) -> Environment"):
        register_environment("tiny", 3)
    with pytest.raises(ValueError, match=r"must be a dataclass with a num_turns field"):
        register_environment("tiny", _build, options=dict)
    with pytest.raises(ValueError, match=r"agent_counts=\(0,\) must list team sizes >= 1"):
        register_environment("tiny", _build, agent_counts=(0,))
    with pytest.raises(ValueError, match=r"factory='comlrl.envs.writing.TLDR' must be 'module:attribute'"):
        register_environment("tiny", "comlrl.envs.writing.TLDR")
    assert "tiny" not in list_environments()
    with pytest.raises(ValueError, match=r"Unknown environment 'tiny'.*register_environment"):
        get_environment("tiny")


def test_replace_and_options():
    register_environment("tiny", _build, agent_counts=(1, 2))
    assert get_environment("tiny", num_agents=1, num_turns=2).num_turns == 2
    with pytest.raises(ValueError, match="num_turns must be an integer >= 1, got 0"):
        get_environment("tiny", num_turns=0)
    with pytest.raises(ValueError, match=r"Unknown option\(s\) for environment .tiny.: .temperature."):
        get_environment("tiny", temperature=1.0)
    register_environment("tiny", "comlrl.envs.writing:TLDR", replace=True)  # a spec by its import path
    assert get_environment("tiny").name == "tldr"
    assert TaskOptions().num_agents == 2 and TaskOptions().num_turns == 1
