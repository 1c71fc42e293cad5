"""The MAGRPO family's trainers: CoMLRL 1.4.x's classes, assembled from a team, the group step
(``reinforce.step``), the greedy evaluation (``reinforce.evaluation``) and a run.

``MAREINFORCETrainer``, ``MARLOOTrainer`` and ``MAReMaxTrainer`` are made from their algorithm
records (``comlrl.trainers.registry``): MAGRPO with the record's ``advantage_mode``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from comlrl.models.entities import load_agents
from comlrl.models.loading import check_model_config
from comlrl.models.lora import normalize_peft_configs
from comlrl.rollout.tree import GroupSample
from comlrl.telemetry.progress import library_bars
from comlrl.telemetry.wandb_sink import check_wandb_ready
from comlrl.trainers.combinations import check_data_parallel, refuse_dynamic_sampling_under_torchrun
from comlrl.trainers.construction import bind_task, check_transition, plan_team, resolve_config
from comlrl.trainers.registry import ALGORITHMS, algorithm_defaults
from comlrl.trainers.reinforce.config import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from comlrl.trainers.reinforce.evaluation import GroupEvaluation
from comlrl.trainers.reinforce.step import GroupStep
from comlrl.trainers.reporting import Reporting, console_enabled, wandb_run_config
from comlrl.trainers.run import Run
from comlrl.trainers.team import Team
from comlrl.trainers.trainer import Trainer

# The record a rollout buffer holds (CoMLRL 1.4.3 name).
NodeSample = GroupSample


def check_eval_hooks(eval_logger: Any, eval_aggregator: Any) -> None:
    for name, value in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
        if value is not None and not callable(value):
            raise ValueError(f"{name} must be callable, got {type(value).__name__}.")


def load_language_team(args: Any, name: str, plan: Any, model_config: Dict[str, Any], peft_configs: Any,
                       wandb_config: Optional[Dict[str, Any]], *, references: bool, data_parallel: bool = True,
                       items_per_step: int = 1, dataset: Any = None, check_prompts: Any = None) -> Team:
    """The team of a trainer whose agents are plain language models (the MAGRPO family, the
    preference trainers): join torchrun (the run's counts must split over its processes), check W&B,
    place, resolve precision, load, build policies."""
    team = Team(args, name, data_parallel=data_parallel)
    check_data_parallel(args, team.dist, items_per_step, dataset)
    check_wandb_ready(wandb_config)  # a missing login is one line now, not a traceback after loading
    reference_devices = team.place_agents(len(plan.sources))
    options = team.load_options(model_config)
    with library_bars(console_enabled(args, wandb_config)):
        models, tokenizers = load_agents(plan, model_config, team.devices, options, peft_configs, team.lora, check_prompts)
        team.build_policies(models, models, tokenizers, plan.sources, reference_devices, references=references)
    return team


class MAGRPOTrainer(Trainer):
    """Multi-Agent GRPO trainer: every agent samples K completions per prompt, joint responses share
    one reward, and each agent follows the policy gradient of its completions' advantages against
    their group (``reinforce.step``; ``MAGRPOConfig``).

    Agents: ``agent_model`` (an id or directory) with ``num_agents`` for identical independent copies,
    or ``agents`` (ids, directories or loaded models, one per agent). ``tokenizer`` is one tokenizer
    for all agents or a list with one per agent; it may be omitted when every agent is given by id.
    ``peft_config`` (one peft config for all agents, or a list with one entry or None per agent)
    trains LoRA adapters instead of full weights; agents of the same base share it (docs/gpu.md).
    """

    algorithm = "magrpo"
    algorithm_name = "MAGRPO"
    default_config_cls = MAGRPOConfig
    config_family = MAGRPOConfig

    def __init__(
        self,
        agent_model: Any = None,
        agents: Optional[List[Any]] = None,
        num_agents: Optional[int] = None,
        tokenizer: Any = None,
        model_config: Optional[Dict[str, Any]] = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Any = None,
        reward_processor: Any = None,
        formatters: Any = None,
        external_transition: Any = None,
        wandb_config: Optional[Dict[str, Any]] = None,
        eval_logger: Any = None,
        eval_aggregator: Any = None,
        args: Optional[MAGRPOConfig] = None,
        peft_config: Any = None,
    ):
        args = resolve_config(args, self.config_family, self.default_config_cls, algorithm_defaults(self.algorithm))
        if agent_model is None and agents is None:
            raise ValueError("Either agent_model or agents must be provided (a model id, a directory, or a list of them).")
        count, plan = plan_team(args, agent_model, agents, num_agents, tokenizer)
        task = bind_task(count, formatters=formatters, train_dataset=train_dataset, eval_dataset=eval_dataset, reward_func=reward_func,
                         reward_processor=reward_processor, external_transition=external_transition, pass_none_external_prompts=False,
                         max_new_tokens=args.max_new_tokens)
        check_transition(args, external_transition, "MAGRPO")
        check_eval_hooks(eval_logger, eval_aggregator)
        refuse_dynamic_sampling_under_torchrun(args)
        model_config = check_model_config(model_config)
        peft_configs = normalize_peft_configs(peft_config, count)
        self.args, self.task, self.model_name = args, task, plan.model_name
        self.team = load_language_team(args, type(self).__name__, plan, model_config, peft_configs, wandb_config,
                                       references=bool(args.reference_kl_enabled), items_per_step=GroupStep.items_for(args, count),
                                       dataset=task.train_dataset, check_prompts=task.prompt_check)
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator
        self.run = self._new_run(wandb_config)
        self.step = GroupStep(args, self.run, task.reward, self.algorithm_name)
        self.evaluation = GroupEvaluation(self.run, task.reward, hooks=self._weak)
        self._attach(self.step)

    def _new_run(self, wandb_config: Optional[Dict[str, Any]]) -> Run:
        """The run of this trainer's team and task: workers started, reporting opened."""
        self.team.start_workers()
        run_config = wandb_run_config(self.args, self.algorithm_name, model_name=self.model_name, num_agents=self.num_agents)
        reporting = Reporting(self.args, self.algorithm_name, self.team.dist, wandb_config, run_config)
        return self._open_run(reporting)

    def _attach(self, step: Any) -> None:
        """``step`` is what the run drives, what holds its buffers and what adds its checkpoint state."""
        self.run.step = step
        contents = self.run.contents
        contents.contributors.append(step)
        contents.buffers, contents.rank_records = step, step.rank_records
        weak = self._weak
        contents.callbacks = lambda: {"eval_logger": weak.eval_logger, "eval_aggregator": weak.eval_aggregator}


def _baseline_trainer(algorithm: str, config: type) -> type:
    """The 1.4.x trainer class of a MAGRPO-family record (MAGRPO with the record's baseline)."""
    record = ALGORITHMS[algorithm]
    name = f"{record.shown_name}Trainer"
    doc = f"MAGRPO with ``advantage_mode={record.defaults['advantage_mode']!r}`` by default (``{config.__name__}``; see ``MAGRPOTrainer``)."
    return type(name, (MAGRPOTrainer,), {"__doc__": doc, "__module__": __name__, "__qualname__": name, "algorithm": algorithm,
                                         "algorithm_name": record.shown_name, "default_config_cls": config})


MAREINFORCETrainer = _baseline_trainer("mareinforce", MAREINFORCEConfig)
MARLOOTrainer = _baseline_trainer("marloo", MARLOOConfig)
MAReMaxTrainer = _baseline_trainer("maremax", MAReMaxConfig)
