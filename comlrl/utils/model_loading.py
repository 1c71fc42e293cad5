"""Model-loading helpers of the CoMLRL 1.4.x public API."""

from comlrl.models.loading import freeze_model, resolve_model_kwargs
from comlrl.models.sources import infer_model_name, resolve_model_sources

__all__ = ["freeze_model", "infer_model_name", "resolve_model_kwargs", "resolve_model_sources"]
