"""What a run writes beside its ``metrics.jsonl``: its resolved config and a short summary.

- ``run_config.json`` at ``train()`` start: the trainer and config class, the seed (torch's initial
  seed: what ``torch.manual_seed`` set, ``comlrl train``'s ``seed``), the models and their sources, the
  training and evaluation data (row counts, and where an environment's rows came from), the task reward
  (and the isolation of a code reward's sandbox), every config field (after
  validation, so defaults and derived values are explicit) and the W&B settings, with the value of
  every key that names a credential replaced by ``"***"`` and the credentials in URLs and header
  values masked (``comlrl.telemetry.redaction``).
- ``run_summary.json`` when ``train()`` returns, fails, is preempted or is stopped by a signal (status
  ``completed``, ``failed``, ``preempted`` (a scheduler's signal or the soft deadline: checkpointed,
  ``exit_code`` the requeue code) or ``interrupted`` (Ctrl-C), with the reason, the signal and the final
  checkpoint), the run id and which ``attempt`` of it this was (a resumed run counts on from the
  summary it finds), the checkpoint it resumed from, the Slurm job and restart count when it runs
  under Slurm, library versions, each model and where it came from, the wall time of this ``train()``
  call, progress, and the latest value of every logged metric.

Both are rewritten atomically by each ``train()`` call (a resumed run updates them).
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from comlrl.models.saving import make_temp_file
from comlrl.models.sources import describe_source
from comlrl.checkpoint.interrupt import TrainingPreempted, signal_of
from comlrl.checkpoint.state import dataset_info, jsonable
from comlrl.telemetry.redaction import redact_secrets, redact_text

CONFIG_FILE = "run_config.json"
SUMMARY_FILE = "run_summary.json"
MASK = "***"


def redact(value: Any) -> Any:
    """A JSON copy of ``value`` with every credential masked (``redact_secrets``: the value of a
    credential key becomes ``"***"``, the key stays so a reader sees it was set; URLs and
    authorization values anywhere lose their credentials). Objects become their repr first, so a
    credential inside a repr is masked too. The W&B sink drops exactly the keys masked here."""
    return redact_secrets(jsonable(value))


def write_json_atomically(path: str, value: Any) -> None:
    """``value`` as indented JSON at ``path``, via a temporary file renamed into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    staging = make_temp_file(directory, f".{os.path.basename(path)}.", ".tmp")
    try:
        with open(staging, "w", encoding="utf-8") as handle:
            json.dump(value, handle, indent=2, sort_keys=False, allow_nan=False)
            handle.write("\n")
        os.replace(staging, path)
    except BaseException:
        if os.path.exists(staging):
            os.remove(staging)
        raise


def library_versions() -> Dict[str, str]:
    import torch
    import transformers

    from comlrl import __version__

    return {"comlrl": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def describe_model(name: str, model: Any, source: Any) -> Dict[str, Any]:
    """Role, source (a path made absolute when it is a local folder), class, parameter count, dtype."""
    if isinstance(source, str):
        where = os.path.abspath(source) if os.path.isdir(source) else source
    else:
        where = describe_source(source)
    parameters = list(model.parameters()) if hasattr(model, "parameters") else []
    return {
        "role": name,
        "source": where,
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in parameters),
        "dtype": str(parameters[0].dtype).removeprefix("torch.") if parameters else None,
    }


def describe_data(dataset: Any) -> Optional[Dict[str, Any]]:
    """Rows of a dataset (None without a length) and, for an environment's, where they came from."""
    info = dataset_info(dataset)
    if info is None:
        return None
    return {"rows": info["length"], **(getattr(dataset, "comlrl_source", None) or {})}


def describe_reward(reward_func: Any) -> Dict[str, Any]:
    """What a run record says of the task reward: its name and, for code rewards, the isolation their
    sandbox actually runs with (``sandbox_isolation``, set by the code environments)."""
    inner = getattr(reward_func, "func", reward_func)  # a trainer may hold a RewardFunction wrapper
    sandbox = getattr(reward_func, "sandbox_isolation", None) or getattr(inner, "sandbox_isolation", None)
    name = getattr(inner, "__qualname__", None) or type(inner).__name__
    return {"name": name, "sandbox": sandbox}


SLURM_FIELDS = {"job_id": "SLURM_JOB_ID", "restart_count": "SLURM_RESTART_COUNT", "array_task_id": "SLURM_ARRAY_TASK_ID",
                "nodes": "SLURM_JOB_NODELIST"}


def scheduler_info() -> Optional[Dict[str, str]]:
    """The Slurm job this process runs in (None outside Slurm): job id, restart count (how many times the
    job was requeued), array task, nodes."""
    if not os.environ.get("SLURM_JOB_ID"):
        return None
    return {key: os.environ[name] for key, name in SLURM_FIELDS.items() if os.environ.get(name)}


def scheduler_note() -> str:
    """`` (Slurm job 123, restart 2)`` for the job log, or "" outside Slurm."""
    info = scheduler_info()
    if info is None:
        return ""
    return f" (Slurm job {info['job_id']}, restart {info.get('restart_count', '0')})"


def read_summary(output_dir: str) -> Optional[Dict[str, Any]]:
    """The ``run_summary.json`` of ``output_dir`` (None when there is none or it cannot be read)."""
    try:
        with open(os.path.join(output_dir, SUMMARY_FILE), encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def latest_metrics(rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The last logged value of every metric key (training, evaluation and epoch means)."""
    latest: Dict[str, Any] = {}
    for row in rows:
        for key, value in row.items():
            if key not in ("env_step", "time"):
                latest[key] = value
    return jsonable(latest)


class RunRecord:
    """Writes ``run_config.json`` and ``run_summary.json`` into ``output_dir`` (see module docstring)."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self._started: Optional[float] = None
        self._started_at: Optional[str] = None
        self.attempt = 1
        self.resumed_from: Optional[str] = None

    def start(self, *, trainer: str, config: Any, wandb_config: Optional[Mapping[str, Any]], seed: Optional[int] = None,
              models: Sequence[Mapping[str, Any]] = (), data: Optional[Mapping[str, Any]] = None,
              reward: Optional[Mapping[str, Any]] = None, run_id: Optional[str] = None, resumed_from: Optional[str] = None) -> None:
        self._started = time.perf_counter()
        self._started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        earlier = read_summary(self.output_dir) if resumed_from is not None else None
        same_run = earlier is not None and run_id is not None and earlier.get("run_id") == run_id
        previous = earlier.get("attempt") if same_run else None
        self.attempt = previous + 1 if isinstance(previous, int) and not isinstance(previous, bool) else (2 if resumed_from else 1)
        self.resumed_from = resumed_from
        fields = {name: getattr(config, name) for name in config.field_names()}
        record = {
            "trainer": trainer,
            "config_class": type(config).__name__,
            "seed": seed,
            "models": [dict(m) for m in models],
            "data": jsonable(dict(data)) if data is not None else None,
            "reward": jsonable(dict(reward)) if reward is not None else None,
            "config": jsonable(redact(fields)),
            "wandb_config": jsonable(redact(dict(wandb_config))) if wandb_config is not None else None,
        }
        write_json_atomically(os.path.join(self.output_dir, CONFIG_FILE), record)

    def finish(
        self,
        *,
        error: Optional[BaseException],
        models: List[Dict[str, Any]],
        progress: Mapping[str, Any],
        history: Sequence[Mapping[str, Any]],
        run_id: Optional[str] = None,
    ) -> None:
        wall = time.perf_counter() - self._started if self._started is not None else None
        stopped_by = signal_of(error) if error is not None else None
        preempted = isinstance(error, TrainingPreempted)
        status = "completed" if error is None else "preempted" if preempted else "interrupted" if stopped_by else "failed"
        summary = {
            "status": status,
            "error": redact_text(f"{type(error).__name__}: {error}") if error is not None else None,
            "signal": stopped_by,
            "reason": error.reason if preempted else None,
            "exit_code": error.exit_code if preempted else None,
            "final_checkpoint": getattr(error, "checkpoint", None),
            "run_id": run_id,
            "attempt": self.attempt,
            "resumed_from": self.resumed_from,
            "scheduler": scheduler_info(),
            "versions": library_versions(),
            "models": models,
            "started_at": self._started_at,
            "wall_time_s": round(wall, 3) if wall is not None else None,
            "progress": dict(progress),
            "final_metrics": latest_metrics(history),
        }
        write_json_atomically(os.path.join(self.output_dir, SUMMARY_FILE), jsonable(summary))
