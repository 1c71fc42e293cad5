"""Reference-KL helpers (CoMLRL 1.4.x import path); they live in ``comlrl.trainers.reference_kl``."""

from comlrl.trainers.reference_kl import (clone_reference_models, load_reference_models_from_sources, reference_kl_coef,
                                          reference_kl_enabled, reference_kl_for_sequence, resolve_reference_devices,
                                          validate_reference_kl_config)

__all__ = ["clone_reference_models", "load_reference_models_from_sources", "reference_kl_coef", "reference_kl_enabled",
           "reference_kl_for_sequence", "resolve_reference_devices", "validate_reference_kl_config"]
