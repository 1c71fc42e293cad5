"""``ActorCriticTrainerBase``: what IAC and MAAC share as trainers. Both are assembled from a team of
actors, a ``CriticSet``, the actor-critic step (``actor_critic.step``), its greedy evaluation and a
run; they differ only in their ``CriticArrangement`` (``iac.IndependentCritics``,
``maac.CentralCritic``): where the critics are and what they read.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type

import torch
import torch.nn as nn

from comlrl.models.loading import check_model_config
from comlrl.models.lora import normalize_peft_configs
from comlrl.models.tokenizers import tokenizer_fix
from comlrl.models.saving import all_or_nothing, check_folder_path
from comlrl.parallel.fsdp import full_model_state, is_sharded
from comlrl.telemetry.progress import library_bars
from comlrl.trainers.actor_critic.config import ActorCriticFields
from comlrl.trainers.actor_critic.entities import CriticArrangement, head_dim, load_actor_critic_team
from comlrl.trainers.actor_critic.evaluation import ActorCriticEvaluation
from comlrl.trainers.actor_critic.export import write_exports
from comlrl.trainers.actor_critic.step import ActorCriticStep
from comlrl.trainers.construction import bind_task, check_transition, plan_team, resolve_config
from comlrl.trainers.registry import algorithm_defaults
from comlrl.trainers.reporting import Reporting, wandb_run_config
from comlrl.trainers.trainer import Trainer


def check_actor_critic_arguments(arrangement: CriticArrangement, agent_model: Any, agents: Any, tokenizer: Any, reward_func: Any,
                                 transition: Any, metrics_callback: Any, critic_model: Any, critics: Any) -> None:
    """The CoMLRL 1.4.3 checks, in its order (the critic's presence is checked by the arrangement's plan)."""
    args, name = arrangement.args, arrangement.name
    if reward_func is None or not callable(reward_func):
        raise ValueError(f"reward_func must be a callable that scores joint responses, got {reward_func!r}.")
    if agent_model is None and agents is None:
        raise ValueError("Either agent_model or agents must be provided (a model id, a directory, or a list of them).")
    arrangement.check_critic_arguments(critic_model, critics)
    if agents is None and isinstance(agent_model, nn.Module) and args.num_agents > 1:
        raise ValueError(
            f"Multi-agent IAC/MAAC requires `agent_model` to be a pretrained identifier string: {args.num_agents} "
            f"agents cannot share one {type(agent_model).__name__} object. Pass a model id or directory, or "
            f"agents=[model_0, model_1, ...] with one model object per agent."
        )
    if agents is not None and tokenizer is None:
        raise ValueError(
            f"Tokenizer must be provided when using agents: {name} takes tokenizer=<one tokenizer> or a list with "
            f"one tokenizer per entry of agents (also when agents are ids or directories, as in CoMLRL). "
            f"{tokenizer_fix(agents)}"
        )
    check_transition(args, transition, name)
    if metrics_callback is not None and not callable(metrics_callback):
        raise ValueError(f"metrics_callback must be callable (rollouts -> dict), got {type(metrics_callback).__name__}.")


class ActorCriticTrainerBase(Trainer):
    """Shared construction, checkpoint contents and export of IAC and MAAC (see the module docstring);
    a subclass names its ``arrangement`` class and its config."""

    arrangement_cls: ClassVar[Type[CriticArrangement]] = CriticArrangement
    config_family: ClassVar[Any] = ActorCriticFields

    def __init__(
        self,
        agent_model: Any = None,
        critic_model: Any = None,
        tokenizer: Any = None,
        reward_func: Any = None,
        reward_processor: Any = None,
        formatters: Any = None,
        args: Optional[ActorCriticFields] = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        model_config: Optional[Dict[str, Any]] = None,
        wandb_config: Optional[Dict[str, Any]] = None,
        metrics_callback: Any = None,
        external_transition: Any = None,
        agents: Optional[List[Any]] = None,
        critics: Optional[List[Any]] = None,
        peft_config: Any = None,
        critic_peft_config: Any = None,
    ):
        args = resolve_config(args, self.config_family, self.default_config_cls, algorithm_defaults(self.algorithm))
        self.arrangement = arrangement = self.arrangement_cls(args)
        check_actor_critic_arguments(arrangement, agent_model, agents, tokenizer, reward_func, external_transition, metrics_callback,
                                     critic_model, critics)
        count, plan = plan_team(args, agent_model, agents, None, tokenizer)
        critic_plan = arrangement.plan(critic_model, critics, count)
        model_config = check_model_config(model_config)
        peft_configs = (
            normalize_peft_configs(peft_config, count),
            normalize_peft_configs(critic_peft_config, len(critic_plan.sources) if critic_plan else 0, "critic_peft_config"),
        )
        if critic_plan is None and critic_peft_config is not None:
            raise ValueError(
                "critic_peft_config was given but there is no critic model (use_separate_critic=False puts value heads on "
                "the actors, which follow peft_config); drop critic_peft_config."
            )
        head_dims = (arrangement.actor_head_dim(model_config), head_dim(args, model_config, "critic_value_head_hidden_dim"))
        self.args, self.model_name = args, plan.model_name
        self.task = bind_task(count, formatters=formatters, train_dataset=train_dataset, eval_dataset=eval_dataset,
                              reward_func=reward_func, reward_processor=reward_processor, external_transition=external_transition,
                              pass_none_external_prompts=True, max_new_tokens=args.max_new_tokens)
        self.team, self.critic_set = load_actor_critic_team(arrangement, plan, critic_plan, model_config, peft_configs, head_dims,
                                                            wandb_config, references=bool(args.reference_kl_enabled),
                                                            items_per_step=ActorCriticStep.items_for(args), dataset=self.task.train_dataset,
                                                            check_prompts=self.task.prompt_check)
        self.metrics_callback = metrics_callback
        self.team.start_workers(self.critic_set.models)
        run_config = wandb_run_config(args, self.algorithm_name, model_name=self.model_name, num_agents=count)
        reporting = Reporting(args, self.algorithm_name, self.team.dist, wandb_config, run_config)
        self.run = self._open_run(reporting)
        self.step = ActorCriticStep(args, self.run, self.critic_set, arrangement, self.task.reward, metrics_callback, self.algorithm_name)
        self.evaluation = ActorCriticEvaluation(self.step, self.task.reward)
        self.run.step = self.step
        contents = self.run.contents
        contents.contributors.append(self.step)
        contents.buffers, contents.rank_records = self.step, self.step.rank_records
        weak = self._weak
        contents.callbacks = lambda: {"metrics_callback": weak.metrics_callback}

    # ------------------------------------------------------------------ the 1.4.x attributes
    @property
    def critics(self) -> List[nn.Module]:
        """One critic per slot (IAC: per agent; MAAC: one); empty with value heads on the actors."""
        return self.critic_set.models

    @property
    def agent_optimizers(self) -> List[torch.optim.Optimizer]:
        return self.team.optimizers

    def named_models(self) -> Dict[str, nn.Module]:
        """Every model of the trainer once, by attribute path ("agents.0", "critics.0", ...)."""
        out: Dict[str, nn.Module] = {}
        seen = set()
        for attribute, models in (("agents", self.agents), ("critics", self.critics), ("reference_models", self.reference_models)):
            for index, model in enumerate(models):
                if id(model) not in seen:
                    seen.add(id(model))
                    out[f"{attribute}.{index}"] = model
        return out

    def named_optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        """Every optimizer once, by attribute path ("agent_optimizers.0", critic optimizers, ...)."""
        return self.step.named_optimizers()

    def _run_models(self) -> List[Tuple[str, nn.Module, Any]]:
        """Actors, then each distinct critic, with their sources (``run_summary.json``)."""
        models = super()._run_models()
        sources = self.critic_set.sources
        models.extend((f"critics.{slot}", critic, sources[slot]) for slot, critic in self.critic_set.distinct())
        return models

    def save_model(self, output_dir: str, overwrite: bool = False, merge_adapters: bool = False) -> None:
        """Export actors, value heads and critics (layout: see the arrangement's ``export_entries``).

        Every folder loads back with ``AutoModelForCausalLM`` (a LoRA-trained model: its adapter,
        loadable with ``PeftModel.from_pretrained(base, folder)``, or with ``merge_adapters=True``
        the merged full model); ``value_head.pt`` holds a head's state dict
        (``load_state_dict(torch.load(path, weights_only=True))``). Existing files are refused unless
        ``overwrite=True``. A W&B run stays open.
        """
        check_folder_path(output_dir, "save_model(output_dir)")
        entries = self.arrangement.export_entries(output_dir, self.agents, self.tokenizers, self.critics)
        for entry in entries:  # collective: every rank gathers a sharded backbone
            entry.backbone_state = full_model_state(entry.model.model) if is_sharded(entry.model.model) else None
        if self.team.dist.is_main:  # under torchrun rank 0 writes (every rank holds the same weights)
            with library_bars(self.verbose), all_or_nothing([entry.path for entry in entries]):
                write_exports(entries, overwrite, merge_adapters)
            self._mark_model_saved()
        self.team.dist.barrier()
