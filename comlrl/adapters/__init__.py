"""Adapters to services outside the process: the HTTP completion client of the API comparator.

Nothing here imports the trainers; trainers and environments call ``CompletionClient``.
"""

from comlrl.adapters.api_formats import API_FORMAT_ALIASES, validate_api_format
from comlrl.adapters.completion_api import (
    CompletionAPIError,
    CompletionAPIRequestError,
    CompletionAPIResponseError,
    CompletionAPIUnavailable,
    CompletionClient,
    InsufficientBalanceError,
)
from comlrl.telemetry.redaction import is_secret_name, redact_secrets, redact_url

__all__ = [
    "API_FORMAT_ALIASES",
    "CompletionAPIError",
    "CompletionAPIRequestError",
    "CompletionAPIResponseError",
    "CompletionAPIUnavailable",
    "CompletionClient",
    "InsufficientBalanceError",
    "is_secret_name",
    "redact_secrets",
    "redact_url",
    "validate_api_format",
]
