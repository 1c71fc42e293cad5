"""Trainers are composed, not inherited (docs/design.md, "How a trainer is put together"): every public
trainer class is a thin face over a team, a step, an evaluation and a run, with a short MRO; the
algorithm records carry what distinguishes the MAGRPO variants; docs/design.md names every module of
``core/`` and of the trainer parts."""

import importlib
import inspect
import os
import re

import pytest

from comlrl.trainers.registry import ALGORITHMS
from tests.helpers.common import REPO_ROOT

PACKAGES = ("comlrl.trainers.reinforce", "comlrl.trainers.actor_critic", "comlrl.trainers.preference")


def public_trainers():
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and (name.endswith("Trainer") or name.endswith("TrainerBase")):
                yield f"{package}:{name}", value


@pytest.mark.parametrize("path,cls", list(public_trainers()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_trainer_has_at_most_three_classes_besides_object(path, cls):
    from comlrl.trainers.trainer import Trainer

    mro = [c for c in cls.__mro__ if c is not object]
    assert len(mro) <= 3, f"{path}: {[c.__name__ for c in mro]}"
    assert Trainer in mro


def test_the_baseline_variants_are_their_records():
    """MAREINFORCE / MARLOO / MAReMax: the record's defaults make their config and trainer classes."""
    from comlrl.trainers import reinforce

    for name, mode in (("mareinforce", "raw"), ("marloo", "rloo"), ("maremax", "max")):
        record = ALGORITHMS[name]
        assert dict(record.defaults) == {"advantage_mode": mode} and record.rl_backend == "group"
        config, trainer = record.config_class(), record.trainer_class()
        assert config().advantage_mode == mode and issubclass(config, reinforce.MAGRPOConfig)
        assert trainer.algorithm == name and trainer.default_config_cls is config and trainer.algorithm_name == record.shown_name
        assert f"advantage_mode: str = '{mode}'" in config.__doc__  # help() shows the record's default


def test_a_plain_magrpo_config_takes_the_records_baseline_unless_set():
    from comlrl.trainers.construction import resolve_config
    from comlrl.trainers.reinforce import MAGRPOConfig, MARLOOConfig

    defaults = ALGORITHMS["marloo"].defaults
    assert resolve_config(MAGRPOConfig(), MAGRPOConfig, MARLOOConfig, defaults).advantage_mode == "rloo"
    assert resolve_config(MAGRPOConfig(advantage_mode="max"), MAGRPOConfig, MARLOOConfig, defaults).advantage_mode == "max"
    given = MAGRPOConfig()
    resolve_config(given, MAGRPOConfig, MARLOOConfig, defaults)
    assert given.advantage_mode == "mean"  # the caller's config is never rewritten


def test_marlhf_backends_are_the_records_that_offer_themselves():
    from comlrl.trainers.preference import MARLHFConfig
    from comlrl.trainers.registry import rl_backends

    assert set(rl_backends()) == {"magrpo", "mareinforce", "marloo", "maremax", "iac", "maac"}
    assert MARLHFConfig(rl_algorithm="marloo").advantage_mode == "rloo"
    assert MARLHFConfig(rl_algorithm="maac", num_generations=1).uses_actor_critic


def _documented_modules():
    root = os.path.join(REPO_ROOT, "comlrl")
    for part in ("core", "trainers", "config"):
        for folder, _dirs, files in os.walk(os.path.join(root, part)):
            for name in files:
                if name.endswith(".py") and name != "__init__.py":
                    yield os.path.relpath(os.path.join(folder, name), root)


def test_design_md_names_every_module_of_core_and_the_trainer_parts():
    with open(os.path.join(REPO_ROOT, "docs", "design.md"), encoding="utf-8") as handle:
        text = handle.read()
    table = re.search(r"\| package \| holds \|\n(.*?)\n\n", text, flags=re.S).group(1)
    rows = {line.split("|")[1].strip().strip("`").rstrip("/"): line for line in table.splitlines()[1:]}
    missing = []
    for path in _documented_modules():
        parts = path.split(os.sep)
        row = rows[parts[0]]
        if len(parts) > 2:  # a family package: its files are listed after "`family/`"
            start = row.find(f"`{parts[1]}/`")
            row = row[start:] if start >= 0 else ""
        if f"`{parts[-1]}`" not in row:
            missing.append(path)
    assert not missing, f"docs/design.md's layer table does not name: {missing}"
