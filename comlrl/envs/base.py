"""What every ready environment is, and the registry that builds them by name.

An ``Environment`` is a task set: a dataset loader, one formatter per agent (dataset row -> prompt),
a reward function over joint responses, the per-term breakdown of that reward
(``reward_details``), and, for multi-turn tasks, the external transition that writes each agent's
next prompt. Families (``writing``, ``coding``, ``minecraft``) define an ``EnvironmentSpec`` per
task, registered at the end of this module with ``register_environment`` (a user's own task is one
more call, see docs/environments.md); ``get_environment(name, **options)`` validates the options
against the task's options dataclass and builds the environment. Nothing here imports the trainers.

The reward calling convention is the trainers' (``comlrl.rollout.rewards``):
``reward_func(completions_1, completions_2, *, batch_items)`` with index-aligned lists (entry j of
every list forms joint response j) and ``batch_items`` holding either one row shared by every joint
response or one row per joint response. It returns one float per joint response.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

# name -> its EnvironmentSpec, or "module:attribute" of one (imported on first use, so importing
# comlrl.envs stays cheap and a family's dependencies load only when one of its tasks is built).
# Filled by register_environment (the ready tasks at the end of this module).
_REGISTRY: Dict[str, Any] = {}

# Names the task repositories use in ``dataset.type`` for the same environments.
ALIASES = {"str_build": "strbuild", "house_build": "housebuild", "che": "coophumaneval", "he": "humaneval"}


def option(default: Any, yaml: Optional[str], doc: str = "") -> Any:
    """A field of an environment's options dataclass: its default, and where a run config sets it
    (a dotted YAML path such as ``"external.mode"``; None: only settable from Python)."""
    metadata = {"yaml": yaml, "doc": doc}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def option_yaml_paths(options_cls: type) -> Dict[str, str]:
    """``{field name: YAML path}`` of the options a run config can set."""
    return {f.name: f.metadata["yaml"] for f in dataclasses.fields(options_cls) if f.metadata.get("yaml")}


@dataclass(frozen=True)
class EnvironmentSpec:
    """How to build one named environment."""

    name: str
    options_cls: type
    """Dataclass of the environment's options (validated in its ``__post_init__``)."""
    build: Callable[[Any], "Environment"]
    """``build(options) -> Environment``."""
    description: str
    agent_counts: Tuple[int, ...] = (2,)
    """The team sizes the task offers (1: the task repositories' single-agent baseline, chosen with
    the ``num_agents`` option)."""


class Environment:
    """A ready task (see the module docstring). Attributes are the public interface:

    ``name``, ``num_agents``, ``num_turns``, ``formatters`` (one callable per agent: row -> prompt),
    ``reward_func``, ``reward_details`` (default: ``{"reward": r}`` per joint response),
    ``external_transition`` (None for single-turn tasks),
    ``options`` (the validated options dataclass), ``rows`` (the ``RowIndex`` transitions read) and
    ``load_dataset(split, offline)``. Families add what is theirs: the code tasks' ``sandbox``,
    HouseBuild's ``seed`` and ``threat``.
    """

    def __init__(
        self,
        *,
        name: str,
        num_agents: int,
        num_turns: int,
        formatters: Sequence[Callable[..., str]],
        reward_func: Callable[..., List[float]],
        reward_details: Optional[Callable[..., List[Dict[str, float]]]] = None,
        external_transition: Optional[Callable[..., List[str]]] = None,
        options: Any,
        loader: Callable[..., Any],
        rows: Optional["RowIndex"] = None,
    ):
        self.name = name
        self.num_agents = num_agents
        self.num_turns = num_turns
        self.formatters = list(formatters)
        self.reward_func = reward_func
        self.reward_details = reward_details if reward_details is not None else _details_of(reward_func)
        self.external_transition = external_transition
        self.options = options
        self.rows = rows if rows is not None else RowIndex(name)
        self._loader = loader
        self.data_sources: Dict[str, Dict[str, Any]] = {}  # split -> where load_dataset's rows came from

    def load_dataset(
        self,
        split: str = "train",
        offline: Optional[bool] = None,
        *,
        hf_split: Optional[str] = None,
        source: Optional[str] = None,
        limit: Optional[int] = None,
        allow_sample_fallback: bool = False,
    ):
        """The ``split`` ("train" or "eval") rows as a ``datasets.Dataset``.

        ``offline=True``: the small sample bundled with comlrl (``hf_split``, when it is not the
        original configs' slice, selects its rows: ``"[:2]"``); ``False`` or ``None``: the real dataset
        (the Hugging Face hub, or ``$COMLRL_DATASETS_DIR``) with the original configs' split slice
        (``hf_split`` overrides it, ``source`` overrides the dataset name or path), an error when it
        cannot be loaded. ``allow_sample_fallback=True`` (with ``offline=None``) uses the sample
        instead of failing, with a one-line notice. ``limit`` keeps the first rows. An empty training
        split is refused. Where the rows came from is in ``env.data_sources[split]`` (and on the
        dataset, ``comlrl_source``), which the run record keeps.
        """
        from comlrl.envs.sources import SOURCE_ATTRIBUTE, with_source

        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
        if offline not in (None, True, False):
            raise ValueError(f"offline must be True, False or None, got {offline!r}.")
        if not isinstance(allow_sample_fallback, bool):
            raise ValueError(f"allow_sample_fallback must be True or False, got {allow_sample_fallback!r}.")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}.")
        asked = None if offline is None and allow_sample_fallback else (False if offline is None else offline)
        dataset = self._loader(split=split, offline=asked, hf_split=hf_split, source=source)
        record = dict(getattr(dataset, SOURCE_ATTRIBUTE, None) or {"source": f"bundled ({self.name})", "split": hf_split})
        if limit is not None and len(dataset) > limit:
            dataset = dataset.select(range(limit))
            record["limit"] = limit
        dataset = with_source(dataset, record)
        if split == "train" and len(dataset) == 0:
            where = f"split {record.get('split')!r} of " if record.get("split") else ""
            raise ValueError(
                f"The {self.name} training data is empty: {where}{record['source']} has no rows. Choose a split with "
                f"rows (dataset.train_split, e.g. '[:2]'), or another dataset."
            )
        self.data_sources[split] = getattr(dataset, SOURCE_ATTRIBUTE)
        return dataset

    def __repr__(self) -> str:
        return f"Environment({self.name!r}, num_agents={self.num_agents}, num_turns={self.num_turns})"


def _details_of(reward_func: Callable[..., List[float]]) -> Callable[..., List[Dict[str, float]]]:
    """The breakdown of a reward without terms: ``{"reward": r}`` per joint response."""

    def details(*completions: Any, **kwargs: Any) -> List[Dict[str, float]]:
        return [{"reward": float(r)} for r in reward_func(*completions, **kwargs)]

    return details


# ----------------------------------------------------------------------------- registry


@dataclass
class TaskOptions:
    """The options of an environment that declares none of its own (``register_environment`` without
    ``options``): the team size and the number of turns, both set by ``comlrl train`` from the run."""

    num_agents: int = option(2, None, "agents in the team (comlrl train: the run's num_agents)")
    num_turns: int = option(1, None, "turns per episode (comlrl train: the trainer section's num_turns)")

    def __post_init__(self) -> None:
        for key in ("num_agents", "num_turns"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}.")


def register_environment(
    name: str,
    factory: Any,
    *,
    options: Optional[type] = None,
    description: str = "",
    agent_counts: Sequence[int] = (2,),
    replace: bool = False,
) -> None:
    """Make ``name`` an environment of ``get_environment`` / ``list_environments`` and of ``comlrl train``
    (``environment: NAME`` in a config).

    ``factory``: ``build(options) -> Environment``, called with the validated options dataclass; or a
    ready ``EnvironmentSpec`` (then ``options`` / ``description`` / ``agent_counts`` come from it), or
    ``"module:attribute"`` naming one, imported when the environment is first asked for.
    ``options``: the options dataclass (``option(default, yaml_path)`` fields; it must have
    ``num_turns``, and ``num_agents`` when the team size varies); default ``TaskOptions``.
    ``agent_counts``: the team sizes the task offers. A name already registered (or one of the
    task repositories' aliases in ``ALIASES``) is refused unless ``replace=True``.
    """
    if not isinstance(name, str) or not name or name != name.strip().lower():
        raise ValueError(f"register_environment: name={name!r} must be a non-empty lower-case string without spaces "
                         f"around it (names are matched in lower case), e.g. {str(name).strip().lower()!r}.")
    if not replace and (name in _REGISTRY or name in ALIASES):
        taken = "an alias of " + repr(ALIASES[name]) if name in ALIASES else "already registered"
        raise ValueError(f"register_environment: the environment name {name!r} is {taken}; choose another name, "
                         f"or pass replace=True to replace it.")
    if isinstance(factory, (str, EnvironmentSpec)):
        if options is not None or description or tuple(agent_counts) != (2,):
            raise ValueError(f"register_environment({name!r}): factory={factory!r} is a spec, which carries its own options, "
                             f"description and agent_counts; pass a build function to give them here.")
        if isinstance(factory, str) and (factory.count(":") != 1 or not all(factory.split(":"))):
            raise ValueError(f"register_environment({name!r}): factory={factory!r} must be 'module:attribute' of an "
                             f"EnvironmentSpec, e.g. 'my_package.tasks:MY_TASK'.")
        _REGISTRY[name] = factory
        return
    if not callable(factory):
        raise ValueError(f"register_environment({name!r}): factory={factory!r} must be a function build(options) -> Environment, "
                         f"an EnvironmentSpec, or 'module:attribute' of one.")
    options_cls = TaskOptions if options is None else options
    if not dataclasses.is_dataclass(options_cls) or "num_turns" not in {f.name for f in dataclasses.fields(options_cls)}:
        raise ValueError(f"register_environment({name!r}): options={options_cls!r} must be a dataclass with a num_turns field "
                         f"(comlrl train sets it from the run); see TaskOptions.")
    counts = tuple(agent_counts)
    if not counts or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts):
        raise ValueError(f"register_environment({name!r}): agent_counts={agent_counts!r} must list team sizes >= 1, e.g. (2,).")
    _REGISTRY[name] = EnvironmentSpec(name, options_cls, factory, description, counts)



def canonical_name(name: str) -> str:
    """The registered name of ``name`` (case-insensitive, task-repository aliases accepted)."""
    if not isinstance(name, str):
        raise ValueError(f"environment name must be a string, got {type(name).__name__}.")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in _REGISTRY:
        close = difflib.get_close_matches(key, list(_REGISTRY) + list(ALIASES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"Unknown environment {name!r}{hint}. Available: {', '.join(list_environments())}. "
                         f"A task of your own is registered with comlrl.envs.register_environment (comlrl train: --import MODULE).")
    return key


def list_environments() -> List[str]:
    """Every registered environment name, sorted."""
    return sorted(_REGISTRY)


def environment_spec(name: str) -> EnvironmentSpec:
    spec = _REGISTRY[canonical_name(name)]
    if isinstance(spec, str):
        module_name, attribute = spec.split(":")
        spec = getattr(importlib.import_module(module_name), attribute)
    return spec


def build_options(name: str, options: Mapping[str, Any]) -> Any:
    """The environment's options dataclass from keyword options; unknown names are refused."""
    spec = environment_spec(name)
    known = [f.name for f in dataclasses.fields(spec.options_cls)]
    unknown = [key for key in options if key not in known]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            hints.append(repr(key) + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"Unknown option(s) for environment {spec.name!r}: {', '.join(hints)}. Valid options: {', '.join(known)}."
        )
    return spec.options_cls(**dict(options))


def get_environment(name: str, **options: Any) -> Environment:
    """Build the environment ``name`` (see ``list_environments()``) with its options."""
    spec = environment_spec(name)
    built = build_options(name, options)
    agents = getattr(built, "num_agents", None)
    if agents is not None and agents not in spec.agent_counts:
        raise ValueError(f"num_agents must be {' or '.join(map(str, spec.agent_counts))} for the {spec.name} environment, got {agents!r}.")
    return spec.build(built)


# ----------------------------------------------------------------------------- helpers for families


def check_options(options: Any, *, modes: Sequence[str] = (), aliases: Optional[Mapping[str, str]] = None, flags: Sequence[str] = (),
                  agent_counts: Sequence[int] = (2,)) -> None:
    """The checks every options dataclass shares: ``num_turns`` an integer >= 1, ``num_agents`` (when
    the options have it) one of ``agent_counts``, ``external_mode`` (normalized through ``aliases``)
    one of ``modes`` when given, each of ``flags`` a bool."""
    turns = options.num_turns
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ValueError(f"num_turns must be an integer >= 1, got {turns!r}.")
    agents = getattr(options, "num_agents", 2)
    if isinstance(agents, bool) or not isinstance(agents, int) or agents not in agent_counts:
        raise ValueError(f"num_agents must be {' or '.join(map(str, agent_counts))} for this environment, got {agents!r}.")
    if modes:
        mode = str(options.external_mode or "").strip().lower()
        options.external_mode = (aliases or {}).get(mode, mode)
        if options.external_mode not in modes:
            raise ValueError(f"external_mode (external.mode) must be one of {', '.join(modes)}; got {options.external_mode!r}.")
    for name in flags:
        if not isinstance(getattr(options, name), bool):
            raise ValueError(f"{name} must be true or false, got {getattr(options, name)!r}.")


def rows_for(batch_items: Optional[Sequence[Any]], count: int, env: str) -> List[Any]:
    """One dataset row per joint response: ``batch_items`` of length 1 is shared, else it must
    have ``count`` entries."""
    if batch_items is None or len(batch_items) == 0:
        raise ValueError(f"The {env} reward needs batch_items=[row] (the dataset rows of the joint responses).")
    items = list(batch_items)
    if len(items) == 1:
        return items * count
    if len(items) != count:
        raise ValueError(
            f"The {env} reward got {len(items)} batch_items for {count} joint responses; give one row shared by "
            f"all of them or one row per joint response."
        )
    return items


def check_completions(completions: Sequence[Sequence[str]], num_agents: int, env: str) -> int:
    """The number of joint responses; every agent must give that many strings."""
    if len(completions) != num_agents:
        raise ValueError(f"The {env} reward takes {num_agents} completion lists (one per agent), got {len(completions)}.")
    counts = {len(c) for c in completions}
    if len(counts) != 1:
        raise ValueError(f"The {env} reward got completion lists of different lengths {sorted(counts)}; they must be index-aligned.")
    for agent, texts in enumerate(completions):
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(f"The {env} reward got a {type(text).__name__} completion from agent {agent + 1}; completions are strings.")
    return counts.pop()


def normalize_prompt(text: Any) -> str:
    """Whitespace-insensitive key of a prompt (how transitions find the row a prompt came from)."""
    return " ".join(str(text or "").split())


class RowIndex:
    """Rows seen by an environment, by the normalized ``prompt`` field.

    A transition receives only the row's ``prompt`` (CoMLRL's external-transition interface); it
    finds the rest of the row (tests, entry point, target) here. Rows enter through
    ``load_dataset``, through every reward call (its ``batch_items``) and through ``add``.
    """

    def __init__(self, env: str):
        self.env = env
        self._rows: Dict[str, Any] = {}

    def add(self, rows: Any) -> None:
        for row in rows:
            if isinstance(row, Mapping) and row.get("prompt"):
                self._rows.setdefault(normalize_prompt(row["prompt"]), dict(row))

    def get(self, prompt: str) -> Any:
        row = self._rows.get(normalize_prompt(prompt))
        if row is None:
            raise ValueError(
                f"The {self.env} transition got a prompt that matches no row this environment has seen "
                f"({str(prompt)[:60]!r}...). Load rows with env.load_dataset(...), or register your own with "
                f"env.rows.add(rows), before training."
            )
        return row


class DetailCache:
    """A small LRU of reward breakdowns, so ``reward_details`` after ``reward_func`` on the same
    joint responses (evaluation logging) does not score them twice (code runs tests)."""

    def __init__(self, size: int = 512):
        self.size = size
        self._items: "OrderedDict[Hashable, Dict[str, float]]" = OrderedDict()

    def get(self, key: Hashable) -> Optional[Dict[str, float]]:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Dict[str, float]) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def batch_scorer(
    *, env: str, num_agents: int, score_many: Callable[[List[Tuple[str, ...]], List[Any]], List[Dict[str, float]]],
    row_key: Callable[[Any], Hashable], cache: DetailCache,
) -> Callable[..., List[Dict[str, float]]]:
    """``details(completions_1, ..., *, batch_items)``: every uncached joint response scored in one
    ``score_many`` call (the code environment runs a batch's tests in parallel)."""

    def details(*completions: Sequence[str], batch_items: Optional[Sequence[Any]] = None, **_: Any) -> List[Dict[str, float]]:
        count = check_completions(completions, num_agents, env)
        rows = rows_for(batch_items, count, env)
        keys = [(tuple(texts[j] for texts in completions), row_key(rows[j])) for j in range(count)]
        missing = [j for j, key in enumerate(keys) if cache.get(key) is None]
        if missing:
            scored = score_many([keys[j][0] for j in missing], [rows[j] for j in missing])
            for j, value in zip(missing, scored):
                cache.put(keys[j], value)
        return [dict(cache.get(key) or {}) for key in keys]

    return details


def reward_from_details(details_fn: Callable[..., List[Dict[str, float]]], key: str = "reward") -> Callable[..., List[float]]:
    """``reward_func`` reading ``key`` from each joint response's breakdown."""

    def reward_func(*completions: Sequence[str], batch_items: Optional[Sequence[Any]] = None, **_: Any) -> List[float]:
        return [float(d[key]) for d in details_fn(*completions, batch_items=batch_items)]

    return reward_func


# the ready tasks, each imported when first asked for
for _name, _spec in (("tldr", "comlrl.envs.writing:TLDR"), ("arxiv", "comlrl.envs.writing:ARXIV"),
                     ("humaneval", "comlrl.envs.coding:HUMANEVAL"), ("coophumaneval", "comlrl.envs.coding:COOPHUMANEVAL"),
                     ("mbpp", "comlrl.envs.coding:MBPP"), ("classeval", "comlrl.envs.coding.classeval:CLASSEVAL"),
                     ("strbuild", "comlrl.envs.minecraft:STRBUILD"),
                     ("housebuild", "comlrl.envs.minecraft:HOUSEBUILD")):
    register_environment(_name, _spec)
del _name, _spec
