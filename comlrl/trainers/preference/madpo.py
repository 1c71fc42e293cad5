"""MADPO: multi-agent direct preference optimization from the team's own ranked samples.

A run is one round of phases (``rounds.PreferenceRounds``; the iterative trainers repeat them):

  1. collect   every item: each agent samples K candidates (one generate call per agent for a batch
               of items), one reward call per item scores the K aligned joint candidates, and
               strict-gap pairs (winner, loser) are kept
  2. learn     ``num_train_epochs`` epochs over the pairs in shuffled batches of ``train_batch_size``,
               one joint-margin update per batch (``pair_step.PairStep``)

A checkpoint can be taken after collection, after every epoch, and every ``checkpoint_steps`` steps
of either phase (docs/checkpoints.md).
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Mapping, Optional, Tuple

from comlrl.models.loading import check_model_config
from comlrl.rollout.formatters import build_formatters
from comlrl.trainers.combinations import refuse_adapters
from comlrl.trainers.construction import bind_task, check_transition, plan_team, resolve_config
from comlrl.trainers.preference.centralized import TaggedCentralizedComparatorAdapter, check_adapter
from comlrl.trainers.preference.collaboration import CentralizedCollaboration, RoleSplittingLogger
from comlrl.trainers.preference.collection import AgentPreferenceTensors, PreferencePair
from comlrl.trainers.preference.config import MADPOConfig
from comlrl.trainers.preference.pair_step import PairStep
from comlrl.trainers.preference.rounds import PREFERENCE_PAIRS, PROGRESS, PreferenceProgress, PreferenceRounds
from comlrl.trainers.registry import algorithm_defaults
from comlrl.trainers.reinforce.evaluation import GroupEvaluation
from comlrl.trainers.reinforce.magrpo import check_eval_hooks, load_language_team
from comlrl.trainers.reporting import Reporting, wandb_run_config
from comlrl.trainers.trainer import Trainer

__all__ = ["AgentPreferenceTensors", "MADPOConfig", "MADPOTrainer", "PreferencePair", "PreferenceProgress"]


def madpo_arguments(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """The ``MADPOTrainer`` arguments among a ``*args, **kwargs`` call (defaults filled in)."""
    signature = inspect.signature(MADPOTrainer.__init__)
    known = {k: v for k, v in kwargs.items() if k in signature.parameters}
    bound = signature.bind(None, *args, **known)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop("self")
    return arguments


def centralize(trainer: Any, args: Any, given: Dict[str, Any]) -> Dict[str, Any]:
    """One joint actor for ``args.num_agents`` roles (``collaboration_mode="centralized"``): checks,
    then its prompt builder, its reward and its eval logger in place of the roles' (``given`` updated)."""
    roles = args.num_agents
    agents, tokenizer, reward_func = given["agents"], given["tokenizer"], given["reward_func"]
    if agents is not None and (isinstance(agents, (str, bytes)) or len(agents) != 1):
        raise ValueError(
            f"collaboration_mode='centralized' trains exactly one actor model (it writes all {roles} roles); got "
            f"agents of length {len(agents) if not isinstance(agents, (str, bytes)) else 'str'}. Pass agents=[one] or agent_model."
        )
    if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
        raise ValueError(f"collaboration_mode='centralized' has one actor, so give one tokenizer (got a list of {len(tokenizer)}).")
    if reward_func is None or not callable(reward_func):
        raise ValueError(f"reward_func must be a callable that scores the {roles} roles' joint responses, got {reward_func!r}.")
    if given["num_agents"] is not None and given["num_agents"] != roles:
        raise ValueError(
            f"num_agents must match args.num_agents in centralized mode (the number of roles): num_agents={given['num_agents']}, "
            f"args.num_agents={roles}."
        )
    trainer.collaboration = CentralizedCollaboration(trainer.centralized_adapter, build_formatters(given["formatters"], roles), reward_func)
    if agents is None and given["agent_model"] is not None:
        given.update(agent_model=None, agents=[given["agent_model"]])
    logger = given["eval_logger"]
    given.update(formatters=trainer.collaboration.prompt, reward_func=trainer.collaboration, num_agents=None,
                 eval_logger=RoleSplittingLogger(logger, trainer.collaboration) if logger is not None else None)
    return given


def assemble_preference_team(trainer: Any, given: Dict[str, Any], *, references: Any) -> None:
    """What every preference trainer builds from its MADPO-shaped arguments ``given``: the config, the
    collaboration, the task, the team of language models, the run and the greedy evaluation.
    ``references(args)``: whether frozen references are loaded."""
    refuse_adapters(type(trainer).__name__, given.pop("peft_config"))
    args = resolve_config(given["args"], trainer.config_family, trainer.default_config_cls, algorithm_defaults(trainer.algorithm))
    trainer.centralized_adapter = check_adapter(given["centralized_comparator_adapter"] or TaggedCentralizedComparatorAdapter())
    trainer.collaboration = None
    roles = args.num_agents if args.collaboration_mode == "centralized" else None
    if roles is not None:
        given = centralize(trainer, args, given)
        args.num_agents = 1  # the one joint actor; restored to the role count below
    if given["agent_model"] is None and given["agents"] is None:
        raise ValueError("Either agent_model or agents must be provided (a model id, a directory, or a list of them).")
    count, plan = plan_team(args, given["agent_model"], given["agents"], given["num_agents"], given["tokenizer"])
    trainer.task = bind_task(count, formatters=given["formatters"], train_dataset=given["train_dataset"], eval_dataset=given["eval_dataset"],
                             reward_func=given["reward_func"], reward_processor=given["reward_processor"],
                             external_transition=given["external_transition"], pass_none_external_prompts=False,
                             max_new_tokens=args.max_new_tokens)
    check_transition(args, given["external_transition"], "MAGRPO")
    check_eval_hooks(given["eval_logger"], given["eval_aggregator"])
    model_config = check_model_config(given["model_config"])
    trainer.args, trainer.model_name = args, plan.model_name
    trainer.team = load_language_team(args, type(trainer).__name__, plan, model_config, [None] * count, given["wandb_config"],
                                      references=references(args), data_parallel=False, check_prompts=trainer.task.prompt_check)
    trainer.eval_logger, trainer.eval_aggregator = given["eval_logger"], given["eval_aggregator"]
    trainer.team.start_workers()
    identity = dict(model_name=trainer.model_name, num_agents=args.num_agents)
    if roles is not None:
        identity.update(num_roles=roles, num_actor_models=1)
    reporting = Reporting(args, trainer.algorithm_name, trainer.team.dist, given["wandb_config"], wandb_run_config(args, trainer.algorithm_name, **identity))
    weak = trainer._weak
    trainer.run = trainer._open_run(reporting)
    trainer.evaluation = GroupEvaluation(trainer.run, trainer.task.reward, hooks=weak)
    trainer.num_roles = roles if roles is not None else count
    if roles is not None:
        args.num_agents = roles
    trainer.run.contents.callbacks = lambda: {"eval_logger": weak.eval_logger, "eval_aggregator": weak.eval_aggregator}


def attach_rounds(trainer: Any, rounds: PreferenceRounds, step: Any) -> None:
    """``rounds`` is the run's body and ``step`` the step of its policy phase; both add their state."""
    run = trainer.run
    trainer.rounds, trainer.step = rounds, step
    run.body, run.step = rounds.run_rounds, step
    contents = run.contents
    contents.contributors.extend([rounds, step])
    contents.buffers, contents.rank_records = step, step.rank_records


class MADPOTrainer(Trainer):
    """Multi-Agent DPO trainer (see the module docstring and ``MADPOConfig``).

    Agents, tokenizers, formatters, reward and datasets as for ``MAGRPOTrainer``. With
    ``collaboration_mode="centralized"`` one actor (``agents=[one]`` or ``agent_model``) writes every
    role's output: ``centralized_comparator_adapter`` (default ``TaggedCentralizedComparatorAdapter``)
    builds its prompt from the ``num_agents`` role prompts and splits its answers for the reward.
    """

    algorithm = "madpo"
    algorithm_name = "MADPO"
    default_config_cls = MADPOConfig
    config_family = MADPOConfig

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
        args: Optional[MADPOConfig] = None,
        *,
        centralized_comparator_adapter: Any = None,
        peft_config: Any = None,
    ):
        given = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        assemble_preference_team(self, given, references=lambda args: False)  # the MADPO loss is reference-free
        rounds = self._rounds()
        attach_rounds(self, rounds, PairStep(rounds, self.algorithm_name))
        self.run.contents.epoch_length = lambda states: len(states["preference_pairs"])

    def _rounds(self) -> PreferenceRounds:
        return PreferenceRounds(self.run, self.algorithm_name)

    progress = PROGRESS
    preference_pairs = PREFERENCE_PAIRS
