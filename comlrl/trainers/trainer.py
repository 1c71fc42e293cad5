"""``Trainer``: the public face every trainer class shares.

A trainer is composed, not inherited: a ``Team`` (agents, tokenizers, optimizers, references,
devices), a step of its algorithm family (``reinforce.step``, ``actor_critic.step``, the preference
steps), an evaluation, and a ``Run`` (epoch loop, evaluation schedule, reporting, checkpoints). The
CoMLRL 1.4.x classes (``MAGRPOTrainer``, ``IACTrainer``, ...) derive from this class only to keep
their pinned constructor signatures and assemble those parts; everything a user calls
(``train``, ``evaluate``, ``save_model``, ``save_checkpoint``, ``load_checkpoint``, ``close`` and
the 1.4.x attributes) is here, delegating to the part that does it.

Lifetime: no part holds the trainer, and no reference cycle passes through its parts. A part that
calls back into its owner (the run's evaluation, the evaluation's hooks, the iterative rounds, a
step's run) holds a weak proxy of it (``run.owner_view``). So ``del trainer`` frees the models,
optimizer states and frozen copies at once, by reference counting, without waiting for Python's
cycle collector (which large tensors do not prompt); ``tests/trainers/test_lifetime.py``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from comlrl.checkpoint.schedule import DEFAULT_REQUEUE_EXIT_CODE, CheckpointSchedule
from comlrl.models.lora import export_view
from comlrl.models.saving import all_or_nothing, check_folder_path, check_target_free, save_pretrained_dir
from comlrl.parallel.fsdp import full_model_state, is_sharded
from comlrl.telemetry.progress import library_bars
from comlrl.trainers.construction import Task
from comlrl.trainers.run import Run, TrainingState, owner_view
from comlrl.trainers.team import Team


class Trainer:
    """The public API of every trainer (see the module docstring). Subclasses assemble ``team``,
    ``task``, ``step``, ``run`` and ``evaluation`` in their constructor."""

    algorithm: ClassVar[str] = ""  # the name of its record in ``comlrl.trainers.registry``
    algorithm_name: ClassVar[str] = ""  # the name shown in logs and messages (CoMLRL 1.4.x's attribute)
    default_config_cls: ClassVar[Any] = None
    config_family: ClassVar[Any] = None

    args: Any
    team: Team
    task: Task
    step: Any
    run: Run
    evaluation: Any
    model_name: Any = None

    @property
    def _weak(self) -> "Trainer":
        """This trainer as its parts hold it (a weak proxy; see "Lifetime" in the module docstring).
        A callback through it must look the method up at each call (``lambda: t._weak.evaluate()``):
        ``t._weak.evaluate`` itself is a bound method, which holds the trainer."""
        return owner_view(self)

    # ------------------------------------------------------------------ public API
    def train(
        self,
        resume_from_checkpoint: Optional[str] = None,
        checkpoint_dir: Optional[str] = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: Optional[int] = None,
        checkpoint_steps: Optional[int] = None,
        checkpoint_every_s: Optional[float] = None,
        stop_after_s: Optional[float] = None,
        requeue_exit_code: int = DEFAULT_REQUEUE_EXIT_CODE,
        **generation_kwargs: Any,
    ) -> None:
        """Train until ``args.num_train_epochs`` epochs are complete (resumed epochs count).

        Checkpoints (off by default; see docs/checkpoints.md): ``checkpoint_dir`` receives
        ``checkpoint-<sequence>`` folders every ``checkpoint_interval`` epochs, after the last epoch,
        every ``checkpoint_steps`` training steps when set, and at the first step boundary
        ``checkpoint_every_s`` seconds after the last save when set; ``checkpoint_total_limit`` keeps
        only the newest of this run's checkpoints. ``resume_from_checkpoint`` (a checkpoint folder, a
        checkpoint_dir for its latest, True for the latest in ``checkpoint_dir``, or ``"auto"``: the
        newest usable checkpoint of the run that owns ``checkpoint_dir``, or a fresh start when it holds
        none) continues a run from the exact step it was saved at.

        Long runs on a cluster (docs/checkpoints.md, "Preemption and requeue"): with a
        ``checkpoint_dir``, SIGUSR1 or SIGTERM lets the current step finish, checkpoints it and raises
        ``comlrl.checkpoint.interrupt.TrainingPreempted``, a ``SystemExit`` with code
        ``requeue_exit_code`` (85), so an uncaught one leaves the process with that code;
        ``stop_after_s`` (seconds from this call) does the same at the last step boundary before it.
        Ctrl-C stops at once (``TrainingInterrupted``).

        ``generation_kwargs`` are extra ``generate`` settings that leave the sampled distribution
        alone (``use_cache``, ``max_time``, ``stop_strings``, ...: ``DISTRIBUTION_FREE_GENERATION_KEYS``);
        the config's sampling settings and anything that reshapes the distribution are refused.
        """
        schedule = CheckpointSchedule.from_train_args(
            checkpoint_dir=checkpoint_dir, checkpoint_interval=checkpoint_interval, checkpoint_total_limit=checkpoint_total_limit,
            checkpoint_steps=checkpoint_steps, resume_from_checkpoint=resume_from_checkpoint, checkpoint_every_s=checkpoint_every_s,
            stop_after_s=stop_after_s, requeue_exit_code=requeue_exit_code,
        )
        self.run.train(schedule, resume_from_checkpoint, generation_kwargs)

    def evaluate(self, num_eval_samples: Optional[int] = None) -> Dict[str, float]:
        """One greedy response per agent per turn on up to ``num_eval_samples`` eval items (default
        ``args.eval_num_samples``); returns the metrics and writes them to the log. An empty dict
        without an eval dataset or with 0 samples."""
        return self.evaluation.evaluate(num_eval_samples)

    def save_checkpoint(self, output_dir: str) -> str:
        """Write a checkpoint of the trainer as it is now into ``output_dir`` (new or empty); return it.

        Refused while ``train()`` runs (checkpoints are taken between steps by ``train`` itself) and
        after a ``train()`` that raised, whose state is partial.
        """
        return self.run.checkpoints.save(output_dir)

    def load_checkpoint(self, path: str) -> Dict[str, Any]:
        """Validate the checkpoint at ``path`` against this trainer, then restore it; return its progress.

        ``path``: a checkpoint folder, its manifest, or a checkpoint_dir (its latest checkpoint).
        Nothing is changed unless every check passes.
        """
        return self.run.checkpoints.load(path)

    def save_model(self, output_dir: str, overwrite: bool = False, merge_adapters: bool = False) -> None:
        """Write ``output_dir/agent_i/`` (weights, config, tokenizer) for every agent.

        Each folder loads back with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and can be given to a
        new trainer as ``agents=[".../agent_0", ...]``. A LoRA-trained agent's folder holds its
        adapter in peft's layout (``PeftModel.from_pretrained(base, folder)``; given back as an agent
        it continues training), or with ``merge_adapters=True`` the merged full model. Existing
        non-empty folders are refused unless ``overwrite=True``. A W&B run stays open.
        """
        check_folder_path(output_dir, "save_model(output_dir)")
        states = [full_model_state(model) if is_sharded(model) else None for model in self.agents]  # collective
        models = [export_view(model, merge_adapters) for model in self.agents]
        if self.team.dist.is_main:  # under torchrun rank 0 writes (every rank holds the same weights)
            targets = self._agent_export_dirs(output_dir)
            for target in targets:
                check_target_free(target, overwrite)
            with library_bars(self.verbose), all_or_nothing(targets):
                for target, model, state, tokenizer in zip(targets, models, states, self.tokenizers):
                    save_pretrained_dir(target, model, tokenizer, overwrite, state_dict=state)
            self._mark_model_saved()
        self.team.dist.barrier()

    def _agent_export_dirs(self, output_dir: str) -> List[str]:
        return [os.path.join(output_dir, f"agent_{i}") for i in range(len(self.agents))]

    def _mark_model_saved(self) -> None:
        wandb = self.run.reporting.wandb
        if wandb is not None:
            wandb.write({"final_model_saved": 1.0}, self.env_step)

    def close(self) -> None:
        """Close metric sinks (and finish a W&B run this trainer opened) and stop the agent workers.
        Safe to call again. ``with XTrainer(...) as trainer:`` calls it when the block ends, however it ends."""
        self.run.reporting.close()
        self.team.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the 1.4.x attributes
    @property
    def agents(self) -> List[nn.Module]:
        return self.team.agents

    @property
    def tokenizers(self) -> List[Any]:
        return self.team.tokenizers

    @property
    def tokenizer(self) -> Any:
        return self.team.tokenizers[0]

    @property
    def policies(self) -> List[Any]:
        return self.team.policies

    @property
    def optimizers(self) -> List[torch.optim.Optimizer]:
        """Every agent's ``torch.optim.AdamW``."""
        return self.team.optimizers

    @property
    def reference_models(self) -> List[nn.Module]:
        return self.team.reference_models

    @property
    def agent_devices(self) -> List[torch.device]:
        return self.team.devices

    @property
    def precision(self) -> Any:
        return self.team.precision

    @property
    def num_agents(self) -> int:
        return len(self.team.agents)

    @property
    def formatters(self) -> List[Any]:
        return self.task.formatters

    @property
    def reward(self) -> Any:
        return self.task.reward

    @property
    def reward_func(self) -> Any:
        return self.task.reward_func

    @property
    def reward_processor(self) -> Any:
        return self.task.reward_processor

    @property
    def external_transition(self) -> Any:
        return self.task.external_transition

    @property
    def train_dataset(self) -> Any:
        return self.task.train_dataset

    @train_dataset.setter
    def train_dataset(self, value: Any) -> None:
        self.task.train_dataset = value

    @property
    def eval_dataset(self) -> Any:
        return self.task.eval_dataset

    @eval_dataset.setter
    def eval_dataset(self, value: Any) -> None:
        self.task.eval_dataset = value

    @property
    def state(self) -> TrainingState:
        return self.run.state

    @property
    def env_step(self) -> int:
        return self.run.state.env_step

    @env_step.setter
    def env_step(self, value: int) -> None:
        self.run.state.env_step = int(value)

    @property
    def metrics(self) -> Any:
        return self.run.reporting.metrics

    @property
    def log_history(self) -> List[Dict[str, Any]]:
        """Every logged row (training and evaluation), oldest first."""
        return self.run.reporting.log_history

    @property
    def verbose(self) -> bool:
        return self.run.reporting.verbose

    @property
    def wandb_config(self) -> Optional[Dict[str, Any]]:
        return self.run.reporting.wandb_config

    @property
    def wandb_initialized(self) -> bool:
        return self.run.reporting.wandb is not None

    @property
    def rollout_buffers(self) -> List[List[Any]]:
        """Each agent's samples waiting for an update."""
        return self.step.buffers

    @rollout_buffers.setter
    def rollout_buffers(self, value: List[List[Any]]) -> None:
        self.step.buffers = value

    def _open_run(self, reporting: Any) -> Run:
        """The run of this trainer's args, team and task, reporting to ``reporting``; it calls back into
        the trainer (evaluation, the models of ``run_summary.json``) through ``_weak`` only."""
        weak = self._weak
        return Run(args=self.args, name=self.algorithm_name, class_name=self._class_name(), team=self.team, task=self.task,
                   reporting=reporting, evaluate=lambda: weak.evaluate(), models=lambda: weak._run_models())

    def _run_models(self) -> List[Tuple[str, nn.Module, Any]]:
        """``(role, model, source)`` of every trained model, for ``run_summary.json``."""
        return [(f"agents.{i}", model, source) for i, (model, source) in enumerate(zip(self.agents, self.team.sources))]

    @classmethod
    def _class_name(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"
