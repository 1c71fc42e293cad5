"""Fixtures of the environment and ``comlrl train`` tests: tiny chat models saved once per session."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from tiny_chat_models import build_chat_models  # noqa: E402


@pytest.fixture(scope="session")
def chat_models(tmp_path_factory):
    """``{"qwen": dir, "llama": dir}`` (see tiny_chat_models)."""
    return build_chat_models(str(tmp_path_factory.mktemp("chat-models")))
