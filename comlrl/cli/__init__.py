"""The ``comlrl`` command line: ``train`` / ``configs`` (``train``), ``demo``, ``plot``, ``estimate``
(with its memory model ``memory`` and the published table ``published``). It assembles; no training
logic lives here."""

from comlrl.cli.main import main

__all__ = ["main"]
