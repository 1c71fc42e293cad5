"""Actor-critic trainers: IAC (independent critics) and MAAC (one centralized critic)."""

from comlrl.trainers.actor_critic.ac_base import ActorCriticTrainerBase
from comlrl.trainers.actor_critic.config import IACConfig, MAACConfig
from comlrl.trainers.actor_critic.iac import IACTrainer
from comlrl.trainers.actor_critic.maac import MAACTrainer
from comlrl.trainers.actor_critic.samples import RolloutSample

__all__ = [
    "ActorCriticTrainerBase",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "RolloutSample",
]
