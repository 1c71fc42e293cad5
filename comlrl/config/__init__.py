"""The config contract every trainer config follows (``ConfigBase``: a dataclass with a docstring
per field, validated in ``__post_init__``, explicit fields remembered, unknown keys refused with a
suggestion), the field groups all RL configs share (``fields``), the shared field checks
(``checks``) and the field docstrings read back from the source (``docs``).

``comlrl train``'s YAML run plan is another part: ``comlrl.runplan``.
"""

from comlrl.config.base import ConfigBase, ConfigFieldError, unknown_fields_message
from comlrl.config.checks import (
    REFERENCE_KL_MODES,
    normalize_parallel_training,
    require_at_least,
    require_bool_fields,
    require_choice,
    require_in_range,
    require_int_at_least,
    require_optional_positive,
    validate_reference_kl,
)
from comlrl.config.fields import GENERATION_BACKENDS, OPTIMIZERS, RESUMABLE_RUN_FIELDS, CommonTrainingFields, PolicyLossFields, RolloutFields

__all__ = [
    "GENERATION_BACKENDS",
    "OPTIMIZERS",
    "REFERENCE_KL_MODES",
    "RESUMABLE_RUN_FIELDS",
    "CommonTrainingFields",
    "ConfigBase",
    "ConfigFieldError",
    "PolicyLossFields",
    "RolloutFields",
    "normalize_parallel_training",
    "require_at_least",
    "require_bool_fields",
    "require_choice",
    "require_in_range",
    "require_int_at_least",
    "require_optional_positive",
    "unknown_fields_message",
    "validate_reference_kl",
]
