"""The Hugging Face hub as a service that may be out of reach: detect it once, then work offline.

Without a network, ``huggingface_hub`` and ``datasets`` retry every request for half a minute or more
before they give up. ``go_offline_if_unreachable()`` opens one TCP connection to the hub's host
(``$HF_ENDPOINT``, default huggingface.co) with a short timeout, name resolution included; when it
fails, the process switches to the libraries' offline mode (``HF_HUB_OFFLINE=1``,
``HF_DATASETS_OFFLINE=1``, also in modules already imported), so every later hub request fails at
once with the library's offline error, which comlrl turns into its own message (``--offline``, a
local folder, or the embedded ``default`` model). A user's own ``HF_HUB_OFFLINE=1`` is respected
and skips the probe.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Callable, Optional
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
_probed: dict = {}


def hub_address() -> tuple:
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def reachable(address: tuple, timeout: float = PROBE_TIMEOUT_S, connect: Optional[Callable[..., socket.socket]] = None) -> bool:
    """Whether a TCP connection to ``address`` opens within ``timeout`` seconds (DNS included: the probe
    runs in a thread, since name resolution has no timeout of its own)."""
    result = {"ok": False}
    connect = connect or socket.create_connection

    def probe() -> None:
        try:
            connect(address, timeout=timeout).close()
            result["ok"] = True
        except OSError:
            pass

    thread = threading.Thread(target=probe, name="comlrl-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return result["ok"]


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def set_offline() -> None:
    """The libraries' offline mode for the rest of the process (also in modules already imported)."""
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    config = sys.modules.get("datasets.config")
    if config is not None:
        config.HF_HUB_OFFLINE = True
        if hasattr(config, "HF_DATASETS_OFFLINE"):
            config.HF_DATASETS_OFFLINE = True


def go_offline_if_unreachable(log: Optional[Callable[[str], None]] = None, timeout: float = PROBE_TIMEOUT_S,
                              connect: Optional[Callable[..., socket.socket]] = None) -> bool:
    """Probe the hub once per process; when it cannot be reached, go offline and say so through ``log``.
    Returns True when the process works offline (already, or from now on)."""
    if is_offline():
        return True
    if "offline" not in _probed:
        host, port = address = hub_address()
        _probed["offline"] = not reachable(address, timeout, connect)
        if _probed["offline"]:
            set_offline()
            if log is not None:
                log(f"the Hugging Face hub ({host}:{port}) cannot be reached within {timeout:g} s: working offline "
                    f"(HF_HUB_OFFLINE=1), so only models and datasets already on this machine are used")
    return _probed["offline"]
