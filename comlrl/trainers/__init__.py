"""Trainers, one package per algorithm family, on the shared loop of ``comlrl.trainers.base``."""

from comlrl.trainers.actor_critic import (
    ActorCriticTrainerBase,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
)
from comlrl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)

__all__ = [
    "ActorCriticTrainerBase",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
]
