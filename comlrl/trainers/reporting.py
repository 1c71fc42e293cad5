"""What a run reports (``Reporting``): the metrics logger and its sinks (memory, JSONL, TensorBoard,
W&B), the console switch, the run record (``run_config.json`` / ``run_summary.json``) and the
zero-signal monitor. The W&B run config is the trainer config's own serialisation, secrets dropped."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from comlrl.parallel.data_parallel import DataParallel
from comlrl.telemetry.metrics import JsonlSink, MemorySink, MetricsLogger
from comlrl.telemetry.run_record import RunRecord
from comlrl.telemetry.signal import ZeroSignalMonitor, signal_metrics
from comlrl.telemetry.tensorboard_sink import TensorBoardSink
from comlrl.telemetry.wandb_sink import WandbSink, scrub_secrets, verbose_from_wandb_config


def console_enabled(args: Any, wandb_config: Optional[Mapping[str, Any]]) -> bool:
    """``args.verbose``, or when it is None ``wandb_config.config_sections.output.verbose`` (default True).
    When False, transformers' own loading/saving bars are silenced too (``library_bars``)."""
    return verbose_from_wandb_config(wandb_config) if args.verbose is None else bool(args.verbose)


def wandb_run_config(args: Any, algorithm: str, **identity: Any) -> Dict[str, Any]:
    """The W&B run config: the algorithm, ``identity`` (model name, team size, ...) and every field of
    the config (``to_dict``: credential fields left out; ``scrub_secrets`` drops any other credential)."""
    return scrub_secrets({"algorithm": algorithm, **identity, **args.to_dict()})


class Reporting:
    """The reporting services of one run (see the module docstring); only rank 0 writes files."""

    def __init__(self, args: Any, name: str, dist: DataParallel, wandb_config: Optional[Mapping[str, Any]], run_config: Dict[str, Any]):
        main = dist.is_main
        self.args = args
        self.wandb_config = dict(wandb_config) if wandb_config is not None else None
        self.verbose = main and console_enabled(args, self.wandb_config)
        self.memory = MemorySink()
        self.wandb: Optional[WandbSink] = None
        self.run_config = run_config
        sinks: List[Any] = [self.memory]
        self.record = RunRecord(args.output_dir) if args.output_dir and main else None
        if args.output_dir and main:
            sinks.append(JsonlSink(os.path.join(args.output_dir, "metrics.jsonl"), overwrite=args.overwrite_output_dir))
        if args.tensorboard and main:
            sinks.append(TensorBoardSink(os.path.join(args.output_dir, "tensorboard")))
        self.metrics = MetricsLogger(sinks, args.logging_steps, merge=dist.merge_metrics)
        self.signal = ZeroSignalMonitor(name)
        if self.wandb_config is not None and main:
            self.start_wandb()

    def start_wandb(self) -> None:
        if self.wandb is None:
            settings = dict(self.wandb_config)
            if not settings.get("dir") and self.args.output_dir:
                settings["dir"] = self.args.output_dir  # W&B's files go under the run folder, not ./wandb
            self.wandb = WandbSink(settings, dict(self.run_config))
            self.metrics.sinks.append(self.wandb)

    def stop_wandb(self) -> None:
        if self.wandb is not None:
            self.metrics.sinks.remove(self.wandb)
            self.wandb.close()
            self.wandb = None

    @property
    def log_history(self) -> List[Dict[str, Any]]:
        """Every logged row (training and evaluation), oldest first."""
        return self.memory.rows

    def record_signal(self, reward_groups: Sequence[Sequence[float]], completion_groups: Sequence[Sequence[str]], env_step: int) -> None:
        """Log the step's zero-signal fractions (``comlrl.telemetry.signal``); warn once when it had none."""
        metrics = signal_metrics(reward_groups, completion_groups)
        self.metrics.record(metrics)
        self.signal.check(metrics, env_step)

    def close(self) -> None:
        self.metrics.close()
