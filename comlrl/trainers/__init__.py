"""Trainers, one package per algorithm family, on the shared loop of ``comlrl.trainers.base``."""

from comlrl.trainers.actor_critic import (
    ActorCriticTrainerBase,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
)
from comlrl.trainers.preference import JointRewardModel, MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
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
    "JointRewardModel",
    "MAACConfig",
    "MAACTrainer",
    "MADPOConfig",
    "MADPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MARLHFConfig",
    "MARLHFTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
]
