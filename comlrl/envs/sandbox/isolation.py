"""OS-level isolation of a sandboxed child: which mechanism this machine offers, and its command prefix.

Strongest first:

- ``bwrap`` (bubblewrap, Debian package ``bubblewrap``): new user, PID, network, IPC, UTS and cgroup
  namespaces; the whole file system read-only except the job's working directory; a private
  ``/tmp``, ``/dev`` and ``/proc``; the user's home hidden behind an empty tmpfs (the interpreter's
  own prefix and the harness stay visible); the sandbox dies with its parent.
- ``unshare`` (util-linux): new network, PID and mount namespaces with a private ``/proc``
  (plus a user namespace when not root); no file-system isolation.
- ``none``: no namespaces. The child still runs with resource limits, a clean environment and the
  harness's audit hook (no sockets, no process creation, no writes outside its directory), which is
  in-process and therefore the weaker guarantee.

``available_isolation()`` probes once per process; ``$COMLRL_SANDBOX_ISOLATION`` (bwrap, unshare,
none) overrides the choice of ``"auto"``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import List, Sequence

ISOLATION_ENV = "COMLRL_SANDBOX_ISOLATION"
LEVELS = ("bwrap", "unshare", "none")


def _probe(command: Sequence[str]) -> bool:
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _unshare_flags() -> List[str]:
    flags = ["--fork", "--kill-child", "--pid", "--mount", "--mount-proc", "--net"]
    if os.geteuid() != 0:
        flags = ["--user", "--map-root-user"] + flags
    return flags


@functools.lru_cache(maxsize=None)
def supported(level: str) -> bool:
    """Whether ``level`` works on this machine (tried once with ``true``)."""
    if level == "none":
        return True
    true = shutil.which("true") or "/bin/true"
    if level == "bwrap":
        path = shutil.which("bwrap")
        return bool(path) and _probe([path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", true])
    if level == "unshare":
        path = shutil.which("unshare")
        return bool(path) and _probe([path, *_unshare_flags(), true])
    raise ValueError(f"Unknown sandbox isolation {level!r}; choose one of {', '.join(LEVELS)} or 'auto'.")


def available_isolation() -> str:
    """The strongest isolation that works here (or ``$COMLRL_SANDBOX_ISOLATION``)."""
    forced = os.environ.get(ISOLATION_ENV, "").strip().lower()
    if forced:
        return resolve_isolation(forced)
    return next(level for level in LEVELS if supported(level))


def resolve_isolation(requested: str) -> str:
    """``"auto"`` -> the strongest available; a named level must work here."""
    level = (requested or "auto").strip().lower()
    if level == "auto":
        return available_isolation()
    if level not in LEVELS:
        raise ValueError(f"sandbox isolation must be one of auto, {', '.join(LEVELS)}; got {requested!r}.")
    if not supported(level):
        hint = " (install the Debian package 'bubblewrap')" if level == "bwrap" else ""
        raise ValueError(f"sandbox isolation {level!r} is not available on this machine{hint}; use 'auto' or 'none'.")
    return level


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


def command_prefix(level: str, *, workdir: str, keep_visible: Sequence[str], hide: Sequence[str]) -> List[str]:
    """The argv prefix that runs a command under ``level``.

    ``keep_visible``: paths the child must read (interpreter prefix, harness) even when they lie
    inside a hidden directory; ``hide``: directories replaced by an empty tmpfs (bwrap only).
    """
    if level == "none":
        return []
    if level == "unshare":
        return [shutil.which("unshare") or "unshare", *_unshare_flags(), "--"]
    args = [
        shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
    ]
    for directory in hide:
        real = os.path.realpath(directory)
        if real in ("/", "") or not os.path.isdir(real) or _under(os.path.realpath(workdir), real):
            continue
        args += ["--tmpfs", real]
        for path in keep_visible:
            path = os.path.realpath(path)
            if _under(path, real) and os.path.exists(path):
                args += ["--ro-bind", path, path]
    args += ["--bind", workdir, workdir, "--chdir", workdir, "--"]
    return args
