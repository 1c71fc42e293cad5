"""Preference-based multi-agent trainers.

- ``MADPOTrainer``: multi-agent DPO on pairs of the team's own ranked samples (reference-free).
- ``MARLHFTrainer``: a joint reward model learned from those pairs (Bradley-Terry), then online RL
  against it (MAGRPO family or actor-critic backends).
- ``MADPOIterTrainer`` / ``MARLHFIterTrainer``: rounds of comparisons against a comparator policy
  (the current policy, a frozen copy, an external model, an earlier round's policy, or an HTTP API),
  with replay of earlier rounds.
- ``JointRewardModel``: the learned reward model (a causal LM with a scalar head).
- Centralized adapters: one model writing every agent's output from one joint prompt.
"""

from comlrl.models.reward_model import JointRewardModel
from comlrl.trainers.preference.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.trainers.preference.config import MADPOConfig, MARLHFConfig
from comlrl.trainers.preference.iterative_config import MADPOIterConfig, MARLHFIterConfig
from comlrl.trainers.preference.iterative import MADPOIterTrainer, MARLHFIterTrainer
from comlrl.trainers.preference.madpo import MADPOTrainer
from comlrl.trainers.preference.marlhf import MARLHFTrainer

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "TaggedCentralizedComparatorAdapter",
]
