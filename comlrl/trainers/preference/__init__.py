"""Preference trainers (work in progress: configs first)."""

from comlrl.models.reward_model import JointRewardModel
from comlrl.trainers.preference.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.trainers.preference.config import MADPOConfig, MARLHFConfig
from comlrl.trainers.preference.iterative_config import MADPOIterConfig, MARLHFIterConfig
