"""What a run reports beside its training (``RunServices``, a mixin of ``TrainerBase``): the metrics
logger and its sinks (memory, JSONL, W&B, TensorBoard), the console switch and the run record."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch.nn as nn

from comlrl.parallel.data_parallel import DataParallel
from comlrl.parallel.workers import AgentWorkers
from comlrl.telemetry.metrics import JsonlSink, MemorySink, MetricsLogger
from comlrl.telemetry.run_record import RunRecord, describe_model
from comlrl.telemetry.signal import ZeroSignalMonitor
from comlrl.telemetry.tensorboard_sink import TensorBoardSink
from comlrl.telemetry.wandb_sink import WandbSink, verbose_from_wandb_config


@dataclass
class TrainingState:
    """Where a run is: the cursor a checkpoint needs to continue from the exact same step."""

    epoch: int = 0  # epochs completed
    position: int = 0  # training items consumed in the current epoch
    env_step: int = 0  # joint rewards computed so far (the x-axis of every log)
    global_step: int = 0  # training steps (one rollout + its updates) so far


class RunServices:
    """The services ``TrainerBase`` runs beside the loop: the metrics logger and its sinks, W&B, the
    run record and what it says of the models."""

    def _init_services(self, wandb_config: Optional[Mapping[str, Any]], run_config: Dict[str, Any]) -> None:
        self._dist = getattr(self, "_dist", None) or DataParallel.current()
        main = self._dist.is_main
        self.state = TrainingState()
        self.wandb_config = dict(wandb_config) if wandb_config is not None else None
        self.verbose = main and self.console_enabled(self.args, self.wandb_config)
        self._memory = MemorySink()
        self._wandb: Optional[WandbSink] = None
        self._run_config = run_config
        sinks: List[Any] = [self._memory]
        self._run_record = RunRecord(self.args.output_dir) if self.args.output_dir and main else None
        if self.args.output_dir and main:
            sinks.append(JsonlSink(os.path.join(self.args.output_dir, "metrics.jsonl"), overwrite=self.args.overwrite_output_dir))
        if self.args.tensorboard and main:
            sinks.append(TensorBoardSink(os.path.join(self.args.output_dir, "tensorboard")))
        self.metrics = MetricsLogger(sinks, self.args.logging_steps, merge=self._dist.merge_metrics)
        self._signal = ZeroSignalMonitor(self.algorithm_name)
        self._generation_kwargs: Dict[str, Any] = {}
        # parallel_training="mp": one worker thread per agent for generation and updates
        self._workers = AgentWorkers(len(self.agents), parallel=self.args.parallel_training == "mp")
        self._dist.broadcast_parameters(list(self.agents) + list(getattr(self, "critics", [])))
        if self.wandb_config is not None and main:
            self._start_wandb()

    @staticmethod
    def console_enabled(args: Any, wandb_config: Optional[Mapping[str, Any]]) -> bool:
        """``args.verbose``, or when it is None ``wandb_config.config_sections.output.verbose`` (default True).
        When False, transformers' own loading/saving bars are silenced too (``library_bars``)."""
        return verbose_from_wandb_config(wandb_config) if args.verbose is None else bool(args.verbose)

    def _start_wandb(self) -> None:
        if self._wandb is None:
            settings = dict(self.wandb_config)
            if not settings.get("dir") and self.args.output_dir:
                settings["dir"] = self.args.output_dir  # W&B's files go under the run folder, not ./wandb
            self._wandb = WandbSink(settings, dict(self._run_config))
            self.metrics.sinks.append(self._wandb)

    @property
    def wandb_initialized(self) -> bool:
        return self._wandb is not None

    @property
    def log_history(self) -> List[Dict[str, Any]]:
        """Every logged row (training and evaluation), oldest first."""
        return self._memory.rows

    def _finish_run_record(self, error: Optional[BaseException]) -> None:
        if self._run_record is None:
            return
        models = [describe_model(name, model, source) for name, model, source in self._run_models()]
        self._run_record.finish(error=error, models=models, progress=asdict(self.state), history=self.log_history)

    def _run_models(self) -> List[Tuple[str, nn.Module, Any]]:
        """``(role, model, source)`` of every trained model, for ``run_summary.json``."""
        sources = getattr(self, "_agent_sources", [None] * len(self.agents))
        return [(f"agents.{i}", model, source) for i, (model, source) in enumerate(zip(self.agents, sources))]
