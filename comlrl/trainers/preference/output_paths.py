"""Where the iterative trainers write their files: ``preference_replay/``, ``policy_checkpoints/``,
``reward_distributions/``.

Each folder is, in this order: the configured field (``preference_replay_dir``,
``policy_checkpoint_dir``; reward distributions have none), else ``<base>/<name>`` for the first base
that is set among ``wandb_config["output_dir"]``, ``wandb_config["config_sections"]["output"]["base_dir"]``,
``wandb_config["dir"]`` and the trainer's ``output_dir``, else ``./<name>``. Paths are made absolute
(``~`` expanded).

Nothing saved is overwritten: when that folder already holds files, the run writes into a new
subfolder ``run-<id>`` (a new run) or ``resume-<id>`` (a run resumed from a checkpoint, which first
writes back the replay shards its checkpoint holds), and says so once.
"""

from __future__ import annotations

import os
import uuid
import warnings
from typing import Any, Dict, Mapping, Optional

NAMES = ("preference_replay", "policy_checkpoints", "reward_distributions")


def _base_dirs(wandb_config: Optional[Mapping[str, Any]], output_dir: Optional[str]):
    config = wandb_config or {}
    sections = config.get("config_sections") or {}
    output = sections.get("output") if isinstance(sections, Mapping) else None
    yield config.get("output_dir")
    yield output.get("base_dir") if isinstance(output, Mapping) else None
    yield config.get("dir")
    yield output_dir


def configured_dir(name: str, configured: Optional[str], wandb_config: Optional[Mapping[str, Any]], output_dir: Optional[str]) -> str:
    """The folder for output ``name`` before the no-overwrite rule (see the module docstring)."""
    path = configured
    if not path:
        base = next((b for b in _base_dirs(wandb_config, output_dir) if b), None)
        path = os.path.join(base, name) if base else os.path.join(os.getcwd(), name)
    return os.path.abspath(os.path.expanduser(str(path)))


class OutputDirs:
    """The run's output folders, chosen once per run (and again after a resume)."""

    def __init__(self, wandb_config: Optional[Mapping[str, Any]], output_dir: Optional[str], configured: Mapping[str, Optional[str]]):
        self.wandb_config = wandb_config
        self.output_dir = output_dir
        self.configured = dict(configured)
        self.resumed = False
        self._cache: Dict[str, str] = {}

    def reset(self, resumed: bool) -> None:
        """Choose folders again (a resume must not write into the folders of the run it continues)."""
        self._cache.clear()
        self.resumed = resumed

    def path(self, name: str) -> str:
        if name not in self._cache:
            path = configured_dir(name, self.configured.get(name), self.wandb_config, self.output_dir)
            taken = set(self._cache.values())
            if (os.path.isdir(path) and os.listdir(path)) or path in taken:
                sub = os.path.join(path, f"{'resume' if self.resumed else 'run'}-{uuid.uuid4().hex[:8]}")
                warnings.warn(f"{path} already holds files; this run writes its {name} into {sub} instead.", stacklevel=3)
                path = sub
            os.makedirs(path, exist_ok=True)
            self._cache[name] = path
        return self._cache[name]
