"""Every public trainer's ``__init__`` signature is CoMLRL 1.4.x's, pinned as text: parameter names,
order, kinds (positional / keyword-only / ``*args``), annotations and defaults. A refactor of the
constructors (shared helpers, the three families' common keywords) must leave these unchanged."""

import importlib
import inspect

import pytest

MAGRPO_INIT = (
    "(self, agent_model: 'Any' = None, agents: 'Optional[List[Any]]' = None, "
    "num_agents: 'Optional[int]' = None, tokenizer: 'Any' = None, model_config: 'Optional[Dict[str, "
    "Any]]' = None, train_dataset: 'Any' = None, eval_dataset: 'Any' = None, reward_func: 'Any' = None, "
    "reward_processor: 'Any' = None, formatters: 'Any' = None, external_transition: 'Any' = None, "
    "wandb_config: 'Optional[Dict[str, Any]]' = None, eval_logger: 'Any' = None, "
    "eval_aggregator: 'Any' = None, args: 'Optional[MAGRPOConfig]' = None, peft_config: 'Any' = None)"
)
ACTOR_CRITIC_INIT = (
    "(self, agent_model: 'Any' = None, critic_model: 'Any' = None, tokenizer: 'Any' = None, "
    "reward_func: 'Any' = None, reward_processor: 'Any' = None, formatters: 'Any' = None, "
    "args: 'Optional[ActorCriticFields]' = None, train_dataset: 'Any' = None, eval_dataset: 'Any' = None, "
    "model_config: 'Optional[Dict[str, Any]]' = None, wandb_config: 'Optional[Dict[str, Any]]' = None, "
    "metrics_callback: 'Any' = None, external_transition: 'Any' = None, agents: 'Optional[List[Any]]' = None, "
    "critics: 'Optional[List[Any]]' = None, peft_config: 'Any' = None, critic_peft_config: 'Any' = None)"
)
MADPO_ITER_INIT = (
    "(self, *args: 'Any', **kwargs: 'Any')"
)
# MADPO adds one keyword-only argument after 1.4.x's: peft_config, refused with a message (the preference
# trainers have no adapter path) instead of a TypeError; every 1.4.x call binds as before.
MADPO_INIT = (
    "(self, agent_model: 'Any' = None, agents: 'Optional[List[Any]]' = None, "
    "num_agents: 'Optional[int]' = None, tokenizer: 'Any' = None, model_config: 'Optional[Dict[str, "
    "Any]]' = None, train_dataset: 'Any' = None, eval_dataset: 'Any' = None, reward_func: 'Any' = None, "
    "reward_processor: 'Any' = None, formatters: 'Any' = None, external_transition: 'Any' = None, "
    "wandb_config: 'Optional[Dict[str, Any]]' = None, eval_logger: 'Any' = None, "
    "eval_aggregator: 'Any' = None, args: 'Optional[MADPOConfig]' = None, *, "
    "centralized_comparator_adapter: 'Any' = None, peft_config: 'Any' = None)"
)
MARLHF_INIT = (
    "(self, *args: 'Any', metrics_callback: 'Any' = None, critic_model: 'Any' = None, "
    "critics: 'Optional[List[Any]]' = None, **kwargs: 'Any')"
)

SIGNATURES = {
    "comlrl.trainers.reinforce:MAGRPOTrainer": MAGRPO_INIT,
    "comlrl.trainers.reinforce:MAREINFORCETrainer": MAGRPO_INIT,
    "comlrl.trainers.reinforce:MARLOOTrainer": MAGRPO_INIT,
    "comlrl.trainers.reinforce:MAReMaxTrainer": MAGRPO_INIT,
    "comlrl.trainers.actor_critic:ActorCriticTrainerBase": ACTOR_CRITIC_INIT,
    "comlrl.trainers.actor_critic:IACTrainer": ACTOR_CRITIC_INIT,
    "comlrl.trainers.actor_critic:MAACTrainer": ACTOR_CRITIC_INIT,
    "comlrl.trainers.preference:MADPOIterTrainer": MADPO_ITER_INIT,
    "comlrl.trainers.preference:MADPOTrainer": MADPO_INIT,
    "comlrl.trainers.preference:MARLHFIterTrainer": MARLHF_INIT,
    "comlrl.trainers.preference:MARLHFTrainer": MARLHF_INIT,
}


def test_every_public_trainer_is_pinned():
    found = set()
    for package in ("comlrl.trainers.reinforce", "comlrl.trainers.actor_critic", "comlrl.trainers.preference"):
        module = importlib.import_module(package)
        found |= {f"{package}:{name}" for name in module.__all__
                  if inspect.isclass(getattr(module, name)) and (name.endswith("Trainer") or name.endswith("TrainerBase"))}
    assert found == set(SIGNATURES)


@pytest.mark.parametrize("path", sorted(SIGNATURES))
def test_init_signature_is_unchanged(path):
    package, name = path.split(":")
    cls = getattr(importlib.import_module(package), name)
    assert str(inspect.signature(cls.__init__)) == SIGNATURES[path]
