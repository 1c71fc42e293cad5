"""Process context (CoMLRL 1.4.x import path); it lives in ``comlrl.parallel.context``."""

from comlrl.parallel.context import DistributedContext, local_context, unwrap_model

__all__ = ["DistributedContext", "local_context", "unwrap_model"]
