"""Ready environments: the writing, code-generation and Minecraft tasks of the CoMLRL experiments.

```python
from comlrl.envs import get_environment, list_environments

list_environments()  # ['arxiv', 'classeval', 'coophumaneval', 'housebuild', 'humaneval', 'mbpp', 'strbuild', 'tldr']
env = get_environment("humaneval", num_turns=2, external_mode="level_feedback")
train = env.load_dataset("train", offline=True)
prompts = [f(train[0]) for f in env.formatters]
rewards = env.reward_func(["def aux(x):\\n    return x"], ["def f(x):\\n    return aux(x)"], batch_items=[train[0]])
```

Each environment: ``name``, ``num_agents``, ``num_turns``, ``formatters`` (one per agent: row ->
prompt), ``reward_func(completions_1, completions_2, *, batch_items)`` (one float per joint
response), ``reward_details(...)`` (the reward's terms per joint response), ``external_transition``
(None for single-turn tasks) and ``load_dataset(split, offline)``. Details: docs/environments.md.

A task of your own is one ``register_environment(name, build)`` call, ``build(options) -> Environment``
(options: ``TaskOptions`` unless you give your own dataclass); ``list_environments()`` then lists it and
``comlrl train`` runs it (``environment: name`` in the config). See docs/environments.md.
"""

from comlrl.envs.base import Environment, EnvironmentSpec, TaskOptions, get_environment, list_environments, option, register_environment

__all__ = ["Environment", "EnvironmentSpec", "TaskOptions", "get_environment", "list_environments", "option", "register_environment"]
