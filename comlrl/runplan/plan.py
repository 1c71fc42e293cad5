"""A run config (the task repositories' YAML layout) + overrides -> a resolved ``RunPlan``, no model loaded.

Layout: ``agent_model`` (name, type, temperature, top_p, top_k, max_length, torch_dtype/dtype,
special_tokens), ``agents``, ``critic_model``, ``critics``, ``dataset`` (name, type, train_split,
eval_split, offline, num_train_items, num_eval_items), ``tokenizer`` (padding_side), ``external``,
``prompt``, ``task``, ``reward``, ``sandbox`` (the environment's options), ``output`` (base_dir,
save_final_model, save_path, verbose), one section per algorithm (``magrpo``, ``iac``, ``maac``, the
single-agent ``grpo`` and ``ac``, ..., the trainer config's fields), ``reward_processor`` (enabled, scale_factor, shift), ``wandb``
(project, entity, name/run_name, dir, tags, group, notes, mode), ``checkpoint`` (dir, interval,
steps, every_s, total_limit, resume, time_limit (seconds), requeue_exit_code), ``seed``, and optionally
``algorithm`` and ``environment``.

Everything is checked here, before any model loads: unknown keys (with suggestions), value types,
the trainer config's own validation, and the training-entity rules (who gives the agents, which
critics an algorithm needs, counts), each error naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from comlrl.trainers.registry import ALGORITHMS, Algorithm, algorithm_sections, trains_critics
from comlrl.envs.base import ALIASES, canonical_name, environment_spec, list_environments, option_yaml_paths
from comlrl.runplan.values import check_section, check_value, leaves, spec_hint, unknown_keys
from comlrl.runplan.overrides import Override, apply_overrides, parse_overrides, raw_text_of

DEFAULT_MODEL = "default"
MODEL_KEYS = {
    "name": "str?", "type": "str?", "temperature": "float?", "top_p": "float?", "top_k": "int?", "max_length": "int?",
    "torch_dtype": "str?", "dtype": "str?", "special_tokens": "dict?", "attn_implementation": "str?", "trust_remote_code": "bool?",
}
FIXED_SECTIONS = {
    "agent_model": MODEL_KEYS,
    "critic_model": MODEL_KEYS,
    "tokenizer": {"padding_side": "str?"},
    "output": {"base_dir": "str?", "save_final_model": "bool", "save_path": "str?", "verbose": "bool?"},
    "reward_processor": {"enabled": "bool", "scale_factor": "float", "shift": "float?"},
    "wandb": {"project": "str?", "entity": "str?", "name": "str?", "run_name": "str?", "dir": "str?", "tags": "list?",
              "group": "str?", "notes": "str?", "mode": "str?"},
    "checkpoint": {"dir": "str?", "interval": "int", "steps": "int?", "total_limit": "int?", "resume": "any", "every_s": "float?",
                   "time_limit": "any", "requeue_exit_code": "int"},
}
DATASET_KEYS = {"name": "str?", "type": "str?", "train_split": "str?", "eval_split": "str?", "offline": "bool?",
                "num_train_items": "int?", "num_eval_items": "int?", "allow_sample_fallback": "bool?"}
ENV_SECTIONS = ("external", "prompt", "task", "reward", "sandbox")
TOP_LEVEL = {"agents", "critics", "dataset", "seed", "algorithm", "environment", *FIXED_SECTIONS, *ENV_SECTIONS}
SAMPLING_KEYS = ("temperature", "top_p", "top_k")
RENAMED = {"model": "agent_model"}


# ----------------------------------------------------------------------------- loading


def bundled_configs() -> List[str]:
    """File names of the configs shipped in ``comlrl/runplan/bundled``."""
    return sorted(p.name for p in resources.files("comlrl.runplan.bundled").iterdir() if p.name.endswith(".yaml"))


def find_config(name_or_path: str) -> Tuple[str, str]:
    """(YAML text, where it came from): a file, else a bundled config of that file name (so
    ``configs/magrpo_tldr_config.yaml`` works without the task repository)."""
    if os.path.isfile(name_or_path):
        with open(name_or_path, encoding="utf-8") as handle:
            return handle.read(), os.path.abspath(name_or_path)
    name = os.path.basename(name_or_path)
    name = name if name.endswith(".yaml") else f"{name}.yaml"
    if name in bundled_configs():
        return resources.files("comlrl.runplan.bundled").joinpath(name).read_text(encoding="utf-8"), f"bundled:{name}"
    close = difflib.get_close_matches(name, bundled_configs(), n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    raise FileNotFoundError(f"--config {name_or_path!r} is neither a file nor a bundled config.{hint} See `comlrl configs`.")


def load_config(name_or_path: str, overrides: Sequence[str] = ()) -> Tuple[Dict[str, Any], List[Override], str]:
    text, source = find_config(name_or_path)
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{source} is not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{source} must hold a mapping of sections, got {type(data).__name__}.")
    parsed = parse_overrides(list(overrides))
    return apply_overrides(data, parsed), parsed, source


# ----------------------------------------------------------------------------- the plan


@dataclass
class Entities:
    """Who the trainer builds (the YAML's model sections, resolved)."""

    agent_model: Optional[str]
    agents: Optional[List[str]]
    critic_model: Optional[str]
    critics: Optional[List[str]]
    num_agents: int
    use_separate_critic: Optional[bool] = None

    def sources(self) -> List[str]:
        return list(self.agents) if self.agents else [self.agent_model] * self.num_agents


@dataclass
class RunPlan:
    """Everything a run needs, checked (``to_dict()`` is what ``--dry-run`` prints)."""

    algorithm: Algorithm
    config: Any
    environment: str
    environment_options: Dict[str, Any]
    entities: Entities
    model_config: Dict[str, Any]
    dataset: Dict[str, Any]
    output: Dict[str, Any]
    reward_processor: Optional[Dict[str, float]]
    wandb: Optional[Dict[str, Any]]
    checkpoint: Dict[str, Any]
    seed: Optional[int]
    source: str
    merged: Dict[str, Any] = field(default_factory=dict)
    """The config after the overrides, with the drawn seed: a config that repeats this run."""

    @property
    def run_dir(self) -> str:
        return self.output["dir"]

    def to_dict(self) -> Dict[str, Any]:
        """The plan as plain data, credentials masked (``without_secrets``)."""
        trainer = self.algorithm.trainer_name
        entities = dataclasses.asdict(self.entities)
        if entities["use_separate_critic"] is None:
            entities.pop("use_separate_critic")
        return without_secrets(_plain({
            "algorithm": self.algorithm.name, "trainer": trainer, "environment": self.environment,
            "environment_options": self.environment_options, "entities": entities,
            "config": {type(self.config).__name__: self.config.to_dict()}, "model_config": self.model_config,
            "dataset": self.dataset, "output": self.output, "reward_processor": self.reward_processor, "wandb": self.wandb,
            "checkpoint": self.checkpoint, "seed": self.seed, "source": self.source,
        }))


def without_secrets(data: Any) -> Any:
    """``data`` for the screen or a file: credential-named fields masked, and the credentials of
    every URL and authorization value in it, whatever its field (``redact_secrets``)."""
    from comlrl.telemetry.redaction import redact_secrets

    return redact_secrets(data)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def choose_algorithm(data: Mapping[str, Any], requested: Optional[str]) -> Tuple[Algorithm, str]:
    """The algorithm (``--algorithm``, else the ``algorithm`` key, else the one section present) and
    the YAML section its config is read from."""
    name = requested or data.get("algorithm")
    if name is None:
        present = sorted({a.name for a in ALGORITHMS.values() if a.sections[0] in data})
        if len(present) != 1:
            found = f"sections {present}" if present else "no algorithm section"
            raise ValueError(f"The config has {found}; say which algorithm to run with --algorithm ({', '.join(ALGORITHMS)}).")
        name = present[0]
    key = str(name).strip().lower()
    if key not in ALGORITHMS:
        close = difflib.get_close_matches(key, list(ALGORITHMS), n=1)
        raise ValueError(f"Unknown algorithm {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "") + f"; choose one of {', '.join(ALGORITHMS)}.")
    algorithm = ALGORITHMS[key]
    section = next((s for s in algorithm.sections if s in data), algorithm.sections[0])
    return algorithm, section


def choose_environment(data: Mapping[str, Any]) -> str:
    """``environment``, else ``dataset.type``, else a name recognised in ``dataset.name``."""
    dataset = data.get("dataset") or {}
    for value in (data.get("environment"), dataset.get("type") if isinstance(dataset, Mapping) else None):
        if value:
            return canonical_name(str(value))
    name = str(dataset.get("name") or "").lower() if isinstance(dataset, Mapping) else ""
    for candidate in ("coophumaneval", "humaneval", "mbpp", "tldr", "arxiv", "str_build", "house_build"):
        if candidate in name.replace("_", "").replace("-", "") or candidate in name:
            return canonical_name(ALIASES.get(candidate, candidate))
    raise ValueError(f"Set environment (or dataset.type) to one of {', '.join(list_environments())}.")


def _model_name(value: Any, key: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key} must be a model id, a local directory or 'default', got {value!r}.")
    return value.strip()


def _name_list(value: Any, key: str) -> Optional[List[str]]:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(
            f"{key} must be a list of model ids or directories (one per entity) or null, got {value!r}; quote JSON lists "
            f"on the command line: {key}='[\"Qwen/A\",\"Qwen/B\"]'."
        )
    return [_model_name(v, f"{key}[{i}]") for i, v in enumerate(value)]


def environment_options(environment: str, data: Mapping[str, Any], raws: Mapping[str, str]) -> Dict[str, Any]:
    """The environment's options set by the config (its YAML paths), type-checked; unknown keys of
    the environment's sections are refused."""
    spec = environment_spec(environment)
    paths = option_yaml_paths(spec.options_cls)
    hints = typing.get_type_hints(spec.options_cls)
    by_path = {path: name for name, path in paths.items()}
    for section in ENV_SECTIONS:
        values = data.get(section)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ValueError(f"{section} must be a section (a mapping), got {values!r}.")
        paths_given = leaves(section, values)
        extra = {"external.external_prompt_passthrough"}
        unknown = [p[len(section) + 1:] for p in paths_given if p not in by_path and p not in extra]
        known = [p[len(section) + 1:] for p in by_path if p.startswith(section + ".")]
        if unknown:
            unknown_keys(f"{section}.", unknown, known)
    dataset = data.get("dataset") or {}
    if not isinstance(dataset, Mapping):
        raise ValueError(f"dataset must be a section (a mapping), got {dataset!r}.")
    declared = {p.split(".", 1)[1] for p in by_path if p.startswith("dataset.")}
    unknown_keys("dataset.", [k for k in dataset if k not in DATASET_KEYS and k not in declared], [*DATASET_KEYS, *declared])
    options: Dict[str, Any] = {}
    for path, name in by_path.items():
        node: Any = data
        for part in path.split("."):
            node = node.get(part, _MISSING) if isinstance(node, Mapping) else _MISSING
        if node is not _MISSING:
            options[name] = check_value(path, node, hints[name], raws.get(path))
    return options


_MISSING = object()


def _dataset(data: Mapping[str, Any], raws: Mapping[str, str]) -> Dict[str, Any]:
    values = data.get("dataset") or {}
    checked = {key: check_value(f"dataset.{key}", values[key], spec_hint(spec), raws.get(f"dataset.{key}")) for key, spec in DATASET_KEYS.items() if key in values}
    for key in ("num_train_items", "num_eval_items"):
        if checked.get(key) is not None and checked[key] < 1:
            raise ValueError(f"dataset.{key} must be >= 1 or null, got {checked[key]}.")
    return {
        "name": checked.get("name"), "train_split": checked.get("train_split"), "eval_split": checked.get("eval_split"),
        "offline": checked.get("offline"), "num_train_items": checked.get("num_train_items"), "num_eval_items": checked.get("num_eval_items"),
        # offline: null loads the real data or fails; the bundled sample replaces it only when asked for
        "allow_sample_fallback": bool(checked.get("allow_sample_fallback")),
    }


def _trainer_config(algorithm: Algorithm, section: str, data: Mapping[str, Any], fixed: Mapping[str, Dict[str, Any]],
                    run_dir: str, raws: Mapping[str, str]) -> Any:
    """The trainer config from its section, sampling from ``agent_model`` where the section is silent,
    ``output_dir`` = the run directory and ``verbose`` from ``output.verbose``."""
    config_cls = algorithm.config_class()
    values = data.get(section) or {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{section} must be a section (a mapping), got {values!r}.")
    values = dict(values)
    unknown_keys(f"{section}.", [k for k in values if k not in config_cls.field_names()], config_cls.field_names())
    for key in SAMPLING_KEYS:
        if key not in values and key in fixed["agent_model"]:
            values[key] = fixed["agent_model"][key]
    if algorithm.agents is not None:
        if values.get("num_agents", algorithm.agents) != algorithm.agents:
            raise ValueError(
                f"{section}.num_agents is {values['num_agents']!r} but {algorithm.name} trains {algorithm.agents} agent (the task "
                f"repositories' single-agent baseline); remove it, or use magrpo, iac or maac for a team."
            )
        values["num_agents"] = algorithm.agents
    values["output_dir"] = run_dir  # already the --output-dir flag, else this section's output_dir, else output.base_dir
    if "verbose" not in values and fixed["output"].get("verbose") is not None:
        values["verbose"] = fixed["output"]["verbose"]
    external = data.get("external") or {}
    if "external_prompt_passthrough" in external:
        values.setdefault("external_prompt_passthrough", external["external_prompt_passthrough"])
    hints = typing.get_type_hints(config_cls)
    own = data.get(section) or {}
    for key in list(values):
        where = f"{section}.{key}" if key in own else f"{section}.{key} (from {_origin(key)})"
        values[key] = check_value(where, values[key], hints[key], raws.get(f"{section}.{key}"))
    try:
        return config_cls.from_dict(values, section=section)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{section}: {error}") from error


def _origin(key: str) -> str:
    return {"output_dir": "output.base_dir", "verbose": "output.verbose", "external_prompt_passthrough": "external"}.get(key, f"agent_model.{key}")


def _entities(algorithm: Algorithm, section: str, data: Mapping[str, Any], fixed: Mapping[str, Dict[str, Any]], config: Any,
              env_agents: Sequence[int], env: str) -> Entities:
    agent_model = _model_name(fixed["agent_model"].get("name"), "agent_model.name")
    agents = _name_list(data.get("agents"), "agents")
    critic_model = _model_name(fixed["critic_model"].get("name"), "critic_model.name")
    critics = _name_list(data.get("critics"), "critics")
    if agent_model is None and agents is None:
        raise ValueError("Set agent_model.name (one model for every agent) or agents (a list, one per agent); both are null.")
    count = len(agents) if agents else config.num_agents
    if agents and algorithm.agents is not None and len(agents) != algorithm.agents:
        raise ValueError(f"{algorithm.name} trains {algorithm.agents} agent (a single-agent baseline) but agents lists {len(agents)} "
                         f"models; give one, or use magrpo, iac or maac for a team.")
    if agents and config.is_explicit("num_agents") and config.num_agents != len(agents):
        raise ValueError(f"{section}.num_agents is {config.num_agents} but agents lists {len(agents)} models; make them agree.")
    if count not in env_agents:
        sizes = " or ".join(map(str, env_agents))
        if algorithm.agents is not None:
            raise ValueError(f"{algorithm.name} trains {algorithm.agents} agent (a single-agent baseline), but the {env} environment has "
                             f"{sizes} agents; use magrpo, iac or maac for it.")
        key = "agents" if agents else f"{section}.num_agents"
        raise ValueError(f"The {env} environment takes {sizes} agents but {key} gives {count}; set {key} to {sizes}.")
    _same("agent_model.name", agent_model, "agents", agents)
    _same("critic_model.name", critic_model, "critics", critics)
    separate = getattr(config, "use_separate_critic", None)
    if algorithm.family == "preference" and getattr(config, "rl_algorithm", None) != "iac":
        separate = None  # MARLHF's use_separate_critic belongs to its IAC backend (MAAC: one centralized critic)
    given = "critics" if critics else "critic_model.name" if critic_model else None
    critics_trained = trains_critics(algorithm, config)
    if not critics_trained and given:
        what = f" with rl_algorithm={config.rl_algorithm!r}" if algorithm.family == "preference" and hasattr(config, "rl_algorithm") else ""
        raise ValueError(f"{algorithm.name}{what} trains no critic, but {given} is set; set it to null.")
    if critics_trained:
        if separate is False and given:
            raise ValueError(f"{given} is set but {section}.use_separate_critic=false puts a value head on each agent; set {given}=None.")
        needed = 0 if separate is False else (1 if separate is None else count)
        # MARLHF's critics default to critic_model_name, else the first actor (the trainer's rule)
        if needed and not given and algorithm.family == "actor_critic":
            raise ValueError(f"{algorithm.name} needs a critic: set critic_model.name, or critics to a list of {needed}.")
        if critics and needed and len(critics) != needed:
            raise ValueError(f"critics lists {len(critics)} models but {algorithm.name} needs {needed}" + (f" (one per agent)." if needed > 1 else " (one centralized critic)."))
    return Entities(agent_model, agents, critic_model, critics, count, separate)


def _same(model_key: str, model: Optional[str], list_key: str, models: Optional[List[str]]) -> None:
    if model and models:
        different = [m for m in models if m != model]
        if different:
            raise ValueError(
                f"{model_key} and {list_key} conflict: {model_key}={model!r} but {list_key} has {different[0]!r}. For different "
                f"models give only {list_key} and set {model_key}=None."
            )


def _model_config(fixed: Mapping[str, Dict[str, Any]], critics_trained: bool) -> Dict[str, Any]:
    from comlrl.models.loading import parse_dtype

    agent, critic = fixed["agent_model"], fixed["critic_model"]
    out: Dict[str, Any] = {}
    for section, values, target in (("agent_model", agent, out), ("critic_model", critic, out.setdefault("critic_model_kwargs", {}))):
        dtype = values.get("torch_dtype") or values.get("dtype")
        if dtype is not None:
            try:
                parse_dtype(dtype)
            except ValueError as error:
                raise ValueError(f"{section}.torch_dtype: {error}") from error
            target["torch_dtype"] = dtype
        for key in ("attn_implementation", "trust_remote_code"):
            if values.get(key) is not None:
                target[key] = values[key]
    if agent.get("special_tokens"):
        out["special_tokens"] = dict(agent["special_tokens"])
    if not critics_trained or not out["critic_model_kwargs"]:
        out.pop("critic_model_kwargs")
    return out


def _wandb(fixed: Mapping[str, Dict[str, Any]], data: Mapping[str, Any], section: str, environment: str) -> Optional[Dict[str, Any]]:
    values = fixed["wandb"]
    if not values.get("project"):
        return None
    out = {key: values[key] for key in ("project", "entity", "dir", "tags", "group", "notes", "mode") if values.get(key) is not None}
    out["name"] = values.get("name") or values.get("run_name") or f"{section}_{environment}"
    out["config_sections"] = {key: _plain(data.get(key) or {}) for key in ("dataset", "agent_model", "output", "external")}
    out["config_sections"]["trainer"] = _plain(data.get(section) or {})
    return out


def _checkpoint(values: Mapping[str, Any]) -> Dict[str, Any]:
    from comlrl.checkpoint.schedule import DEFAULT_REQUEUE_EXIT_CODE, check_requeue_exit_code, parse_duration

    out = {"dir": values.get("dir"), "interval": values.get("interval", 1), "steps": values.get("steps"),
           "total_limit": values.get("total_limit"), "resume": values.get("resume"), "every_s": values.get("every_s"),
           "time_limit": values.get("time_limit"), "requeue_exit_code": values.get("requeue_exit_code", DEFAULT_REQUEUE_EXIT_CODE)}
    if out["resume"] is not None and not isinstance(out["resume"], (str, bool)):
        raise ValueError(f"checkpoint.resume must be a checkpoint path, auto (this run's newest checkpoint in checkpoint.dir, or "
                         f"a fresh start), true (the latest in checkpoint.dir) or null; got {out['resume']!r}.")
    if out["time_limit"] is not None:  # seconds (YAML reads an unquoted 47:30:00 as 171000), or a duration's text
        out["time_limit"] = parse_duration(out["time_limit"], "checkpoint.time_limit")
    check_requeue_exit_code(out["requeue_exit_code"], "checkpoint.requeue_exit_code")
    return out


def resolve(data: Mapping[str, Any], overrides: Sequence[Override] = (), *, source: str = "<config>",
            algorithm: Optional[str] = None, output_dir: Optional[str] = None) -> RunPlan:
    """Check a merged config and resolve it into a ``RunPlan`` (see the module docstring)."""
    raws = raw_text_of(overrides)
    for old, new in RENAMED.items():
        if old in data:
            raise ValueError(f"Config section {old!r} is the older layout's name; rename it to {new!r}.")
    chosen, section = choose_algorithm(data, algorithm)
    unknown_keys("", [k for k in data if k not in TOP_LEVEL and k not in algorithm_sections()], [*TOP_LEVEL, *algorithm_sections()])
    fixed = {name: check_section(name, data.get(name), spec, raws) for name, spec in FIXED_SECTIONS.items()}
    if fixed["tokenizer"].get("padding_side") not in (None, "left"):
        raise ValueError("tokenizer.padding_side: comlrl left-pads prompts for generation itself; give 'left' or leave it out.")
    environment = choose_environment(data)
    seed = check_value("seed", data.get("seed"), typing.Optional[int], raws.get("seed"))
    if seed is None:
        import secrets

        seed = secrets.randbits(31)
    options = environment_options(environment, {**data, "seed": seed}, raws)
    section_values = data.get(section) or {}
    run_dir = output_dir or (section_values.get("output_dir") if isinstance(section_values, Mapping) else None) or fixed["output"].get("base_dir") or f"runs/{chosen.name}_{environment}"
    from comlrl.models.saving import check_folder_path

    check_folder_path(run_dir, "The run directory (--output-dir / output.base_dir)")
    config = _trainer_config(chosen, section, data, fixed, run_dir, raws)
    spec = environment_spec(environment)
    entities = _entities(chosen, section, data, fixed, config, env_agents=spec.agent_counts, env=environment)
    options["num_turns"] = config.num_turns
    if "num_agents" in {f.name for f in dataclasses.fields(spec.options_cls)}:
        options["num_agents"] = entities.num_agents
    from comlrl.envs.base import build_options

    build_options(environment, options)  # the environment's own checks, before anything loads
    save_path = fixed["output"].get("save_path")
    if save_path is None or save_path == fixed["output"].get("base_dir"):
        save_path = config.output_dir  # the agents follow the run directory (also when --output-dir moves it)
    output = {"dir": config.output_dir, "save_final_model": fixed["output"].get("save_final_model", True), "save_path": save_path}
    wandb = _wandb(fixed, data, section, environment)
    if wandb is not None and not wandb.get("dir"):
        wandb["dir"] = config.output_dir  # W&B's files (offline runs too) go under the run folder, not ./wandb
    processor = fixed["reward_processor"]
    reward_processor = None
    if processor.get("enabled", False):
        reward_processor = {"scale_factor": processor.get("scale_factor", 1.0), "shift": processor.get("shift") or 0.0}
    return RunPlan(
        algorithm=chosen, config=config, environment=environment, environment_options=options, entities=entities,
        model_config=_model_config(fixed, trains_critics(chosen, config)), dataset=_dataset(data, raws), output=output,
        reward_processor=reward_processor, wandb=wandb,
        checkpoint=_checkpoint(fixed["checkpoint"]), seed=seed, source=source, merged=_repeatable(data, seed, section, output_dir),
    )


def _repeatable(data: Mapping[str, Any], seed: int, section: str, output_dir: Optional[str]) -> Dict[str, Any]:
    """The config after the overrides with the drawn seed and, when ``--output-dir`` moved the run, that
    directory as ``output.base_dir`` (and the section's ``output_dir``): ``--config RUN/config.yaml``
    repeats the run in the same place."""
    merged = _plain({**data, "seed": seed})
    if output_dir:
        merged["output"] = {**(merged.get("output") or {}), "base_dir": output_dir}
        if isinstance(merged.get(section), Mapping) and merged[section].get("output_dir"):
            merged[section] = {**merged[section], "output_dir": output_dir}
    return merged


def plan_from_args(config: str, overrides: Sequence[str] = (), *, algorithm: Optional[str] = None, output_dir: Optional[str] = None) -> RunPlan:
    """``resolve`` of a config file or bundled name with command-line overrides."""
    data, parsed, source = load_config(config, overrides)
    return resolve(data, parsed, source=source, algorithm=algorithm, output_dir=output_dir)
