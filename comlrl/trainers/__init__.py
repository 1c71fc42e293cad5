"""Trainers, one package per algorithm family, each assembled from a team, a step and a run (``comlrl.trainers.trainer``)."""

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
