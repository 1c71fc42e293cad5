"""Weights & Biases as an optional metrics sink.

``wandb_config`` keys: project, entity, name (or run_name), tags, dir, id, resume, mode and
``config_sections`` (dicts merged into the run config; ``config_sections.output.verbose`` controls
console output). W&B is imported only when a config is given. API keys are read by W&B from its own
environment and are never written by comlrl.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

from comlrl.telemetry.redaction import redact_secrets


def scrub_secrets(value: Any) -> Any:
    """A copy of nested dicts/lists with every credential field removed (``api_key``, ``hf_token``,
    ``password``, ...; not ``max_new_tokens`` or ``pad_token``) and the credentials of URLs and
    authorization values in the other strings masked: see ``comlrl.telemetry.redaction``."""
    return redact_secrets(value, drop=True)


def verbose_from_wandb_config(wandb_config: Optional[Mapping[str, Any]], default: bool = True) -> bool:
    sections = (wandb_config or {}).get("config_sections") or {}
    output = sections.get("output") if isinstance(sections, Mapping) else None
    if isinstance(output, Mapping) and "verbose" in output:
        return bool(output["verbose"])
    return default


def wandb_init_kwargs(wandb_config: Mapping[str, Any], run_config: Dict[str, Any]) -> Dict[str, Any]:
    """Keyword arguments for ``wandb.init``; ``config_sections`` are merged into ``run_config``."""
    sections = wandb_config.get("config_sections") or {}
    if not isinstance(sections, Mapping):
        raise ValueError(f"wandb_config['config_sections'] must be a dict, got {type(sections).__name__}.")
    for key, value in sections.items():
        run_config[key] = scrub_secrets(value)
    dataset = sections.get("dataset")
    if isinstance(dataset, Mapping):
        if "name" in dataset:
            run_config["dataset_name"] = dataset["name"]
        if "type" in dataset:
            run_config["dataset_type"] = dataset["type"]
    cleaned = scrub_secrets(run_config)  # in place: ``config`` stays the caller's dict, as in 1.4.x
    run_config.clear()
    run_config.update(cleaned)
    kwargs: Dict[str, Any] = {
        "project": wandb_config.get("project"),
        "entity": wandb_config.get("entity"),
        "name": wandb_config.get("name") or wandb_config.get("run_name"),
        "config": run_config,
    }
    if wandb_config.get("dir"):
        os.makedirs(wandb_config["dir"], exist_ok=True)
        kwargs["dir"] = wandb_config["dir"]
    if isinstance(wandb_config.get("tags"), (list, tuple)):
        kwargs["tags"] = list(wandb_config["tags"])
    for key in ("id", "resume", "mode", "group", "notes"):
        if wandb_config.get(key) is not None:
            kwargs[key] = wandb_config[key]
    return kwargs


WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def wandb_logged_in() -> bool:
    """``WANDB_API_KEY`` is set, or ``wandb login``'s netrc entry exists (only its presence is read:
    the key never enters a message, a log or a file)."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_wandb_ready(wandb_config: Optional[Mapping[str, Any]], *, project_key: str = "wandb_config['project']",
                      mode_setting: str = "wandb_config['mode']={!r}") -> None:
    """Before any model loads: an online W&B run needs a login (one line naming the fixes); the mode
    must be one of W&B's. Nothing to check without a config, without the package (the sink then says
    so) or with a run already active (it is adopted). ``project_key`` and ``mode_setting`` (a format
    string of the mode) name the settings as the caller's user writes them."""
    import importlib.util
    import sys

    if wandb_config is None or importlib.util.find_spec("wandb") is None:
        return
    mode = str(wandb_config.get("mode") or os.environ.get("WANDB_MODE") or "online").strip().lower()
    if mode not in WANDB_MODES:
        raise ValueError(f"{mode_setting.format(mode)} is not a W&B mode; use online, offline or disabled.")
    active = sys.modules.get("wandb")
    if mode in ("offline", "disabled", "dryrun") or wandb_logged_in() or getattr(active, "run", None) is not None:
        return
    raise ValueError(
        f"{project_key}={wandb_config.get('project')!r} logs to W&B online, but this machine has no W&B login: run "
        f"`wandb login` (or set WANDB_API_KEY), or set {mode_setting.format('offline')} (the run's files go under the run "
        f"folder) or {mode_setting.format('disabled')}."
    )


class WandbSink:
    """Logs rows to a W&B run this trainer opened (or adopts the active one)."""

    def __init__(self, wandb_config: Mapping[str, Any], run_config: Dict[str, Any]):
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                "wandb_config was given but the wandb package is not installed: pip install 'comlrl[wandb]'."
            ) from exc
        self._wandb = wandb
        self.owned = wandb.run is None
        self.run = wandb.run if wandb.run is not None else wandb.init(**wandb_init_kwargs(wandb_config, run_config))

    @property
    def identity(self) -> Dict[str, Optional[str]]:
        return {"id": self.run.id, "project": getattr(self.run, "project", None), "entity": getattr(self.run, "entity", None)}

    def write(self, row: Mapping[str, float], step: int) -> None:
        self.run.log(dict(row), step=step)

    def close(self) -> None:
        """Finish the run if this trainer opened it (``save_model`` never calls this)."""
        if self.owned and self._wandb.run is self.run:
            self.run.finish()
