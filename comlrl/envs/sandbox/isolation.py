"""How a candidate is contained: the isolation levels, their probes, and the bubblewrap command line.

Levels:

- ``bwrap`` (bubblewrap, Debian/Ubuntu package ``bubblewrap``; the only containing level): the
  candidate gets its own user, PID, network, IPC, UTS and mount namespaces (and cgroup namespace
  where the kernel has one); it runs as uid/gid 65534 with no capabilities, no supplementary groups
  and ``no_new_privs``, and cannot create user namespaces of its own. Its file system is built
  from nothing: ``/usr`` (and the ``/bin``, ``/lib*`` links or directories) and the interpreter's
  prefix read-only, the sandbox's own scripts read-only at ``/opt/comlrl-sandbox``, a private
  ``/proc`` and minimal ``/dev``, and one size-limited tmpfs ``/sandbox`` (the working directory,
  ``HOME`` and ``TMPDIR``; ``/tmp`` points into it). Nothing else of the host exists inside: not the
  trainer's home, ``/tmp``, ``/etc``, ``/run`` or unix sockets, not this package's datasets (hidden
  by an empty tmpfs wherever a read-only bind would show them). The sandbox dies with the trainer
  (``--die-with-parent``) and every process in it dies with the job (its PID namespace).

  A root trainer runs bubblewrap inside a user namespace of its own (``UserNamespacePool``) that
  maps only uid/gid 0 and 65534 to themselves and allows no nested user namespace; the harness
  drops from 0 to 65534 before it reads any candidate code, so the candidate's host identity is
  ``nobody``, not root. A non-root trainer uses bubblewrap's own ``--unshare-user --uid 65534
  --disable-userns``: inside uid 65534, outside the trainer's uid (without privileges it cannot be
  another).

- ``none``: no containment at all; the candidate runs on the host as the trainer's user, with
  resource limits, a clean environment and the harness's audit hook
  only. The checker split still holds (pass/fail is decided in another process), but a hostile
  candidate can harm the machine. Only ever used when asked for by name (``isolation="none"``,
  ``sandbox.isolation=none`` or ``$COMLRL_SANDBOX_ISOLATION=none``); it warns once per process.

``"auto"`` means bwrap, and when bwrap is not usable it raises ``SandboxUnavailableError`` with the
reason and the fix: there is no silent fallback to a weaker level.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import warnings
from typing import Dict, List, Optional, Sequence

from comlrl.envs.sandbox import seccomp

ISOLATION_ENV = "COMLRL_SANDBOX_ISOLATION"
LEVELS = ("bwrap", "none")
RETIRED = {"unshare": "it ran the candidate as root with the host's whole file system"}
NOBODY = 65534
RUNTIME_MOUNT = "/opt/comlrl-sandbox"
WORKDIR = "/sandbox"
RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora/RHEL: dnf install bubblewrap; "
    "Arch: pacman -S bubblewrap), or, only on a machine you do not mind a hostile program running on, "
    "opt out of containment with isolation='none' (config: sandbox.isolation=none; environment: "
    f"{ISOLATION_ENV}=none)"
)
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_USERNS_HOLDER = r"""
import ctypes, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
    sys.stdout.write("unshare failed: errno %d\n" % ctypes.get_errno()); sys.exit(1)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
with open("/proc/sys/user/max_user_namespaces", "w") as limit:
    limit.write("0")
sys.stdout.write("sealed\n"); sys.stdout.flush()
sys.stdin.readline()
"""


class SandboxUnavailableError(ValueError):
    """The requested isolation cannot be had on this machine (the message says how to get it)."""


class SandboxIsolationWarning(UserWarning):
    """Untrusted code is about to run without containment (``isolation="none"``)."""


def interpreter() -> str:
    """The real interpreter the sandboxed processes run (a virtual environment's base, resolved)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


# ----------------------------------------------------------------------------- user namespaces (root)


class UserNamespacePool:
    """User namespaces for a root trainer's sandboxes, one per job running at a time.

    Each maps uid/gid 0 and 65534 to themselves (nothing else), and its ``max_user_namespaces`` is
    0, so nothing inside can make another. A namespace lives as long as the descriptor held here.
    Concurrent jobs get different namespaces, so one job's processes never count against another's
    ``RLIMIT_NPROC``.
    """

    def __init__(self) -> None:
        self._free: List[int] = []
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
        return _new_user_namespace()

    def release(self, fd: int) -> None:
        with self._lock:
            self._free.append(fd)


def _new_user_namespace() -> int:
    holder = subprocess.Popen([interpreter(), "-I", "-S", "-c", _USERNS_HOLDER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, close_fds=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            raise OSError(f"could not create a user namespace: {holder.stderr.read().strip() or 'no reason given'}")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as handle:
                handle.write(f"0 0 1\n{NOBODY} {NOBODY} 1\n")
        holder.stdin.write("go\n")
        holder.stdin.flush()
        if holder.stdout.readline().strip() != "sealed":
            raise OSError("could not forbid nested user namespaces")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        holder.wait()
        for stream in (holder.stdin, holder.stdout, holder.stderr):
            stream.close()


_POOL = UserNamespacePool()


def user_namespaces() -> UserNamespacePool:
    return _POOL


# ----------------------------------------------------------------------------- the bubblewrap command


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


def _package_root() -> str:
    return os.path.realpath(os.path.dirname(os.path.dirname(RUNTIME_DIR)))


def _parents(path: str, bound: Sequence[str]) -> List[str]:
    """``--dir`` arguments (mode 0755) for the ancestors of ``path`` that no bind provides."""
    args: List[str] = []
    parts = path.strip(os.sep).split(os.sep)[:-1]
    current = ""
    for part in parts:
        current += os.sep + part
        if not any(_under(current, b) for b in bound):
            args += ["--perms", "0755", "--dir", current]
    return args


def file_system_args(python: str, disk_bytes: int) -> List[str]:
    """The candidate's view of the file system (see the module docstring)."""
    args: List[str] = []
    bound: List[str] = []
    for directory in _SYSTEM_DIRS:
        if os.path.islink(directory):
            args += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            args += ["--ro-bind", directory, directory]
            bound.append(directory)
    prefix = os.path.realpath(sys.base_prefix)
    for path in (prefix, os.path.dirname(python)):
        if not any(_under(path, b) for b in bound):
            args += _parents(path, bound) + ["--ro-bind", path, path]
            bound.append(path)
    package = _package_root()
    if any(_under(package, b) for b in bound):
        args += ["--tmpfs", package]  # an installed comlrl: its datasets stay out of sight
    args += ["--ro-bind", RUNTIME_DIR, RUNTIME_MOUNT, "--proc", "/proc", "--dev", "/dev",
             "--perms", "01777", "--size", str(int(disk_bytes)), "--tmpfs", WORKDIR,
             "--symlink", WORKDIR + "/tmp", "/tmp", "--chdir", WORKDIR]
    return args


def bwrap_command(python: str, disk_bytes: int, userns_fd: Optional[int], info_fd: Optional[int] = None,
                  seccomp_fd: Optional[int] = None) -> List[str]:
    """The argv prefix that runs a command in the candidate's sandbox; ``userns_fd``: a root
    trainer's namespace from ``UserNamespacePool`` (None: bubblewrap makes its own); ``info_fd``:
    where bubblewrap writes the sandbox init's host pid; ``seccomp_fd``: a pipe holding
    ``seccomp.program()``."""
    args = [shutil.which("bwrap") or "bwrap"] + (["--info-fd", str(info_fd)] if info_fd is not None else [])
    args += ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    if userns_fd is not None:
        args += ["--userns", str(userns_fd), "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--disable-userns", "--cap-drop", "ALL"]
    args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    return args + file_system_args(python, disk_bytes) + ["--"]


# ----------------------------------------------------------------------------- probing and choosing


def seccomp_pipe() -> Optional[int]:
    """The read end of a pipe that holds this machine's seccomp program (None: no table here)."""
    code = seccomp.program()
    if code is None:
        return None
    read, write = os.pipe()
    try:
        os.write(write, code)  # a few hundred bytes: always fits in the pipe
    finally:
        os.close(write)
    return read


_PROBE = r"""
import json, os, sys
sys.path[:0] = ["%s", "%s"]
import harness
harness.drop_privileges()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
try:
    open("/usr/.comlrl-probe", "w")
    writable = True
except OSError:
    writable = False
print(json.dumps({"uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(), "cap_eff": status["CapEff"].strip(),
                  "no_new_privs": status["NoNewPrivs"].strip(), "usr_writable": writable, "seccomp": status["Seccomp"].strip(),
                  "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}))
""" % (RUNTIME_MOUNT, RUNTIME_DIR)


@functools.lru_cache(maxsize=None)
def bwrap_report() -> Dict[str, object]:
    """Run the sandbox once and read what the candidate would be (cached per process).

    ``{"ok": bool, "reason": str, ...}``: ok only if bubblewrap starts and the process inside is
    not root, has no effective capabilities, has ``no_new_privs`` and cannot write ``/usr``."""
    path = shutil.which("bwrap")
    if not path:
        return {"ok": False, "reason": "bubblewrap (bwrap) is not installed"}
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    fd = None
    filter_fd = seccomp_pipe()
    try:
        fd = _POOL.acquire() if os.geteuid() == 0 else None
        fds = tuple(f for f in (fd, filter_fd) if f is not None)
        done = subprocess.run(bwrap_command(interpreter(), 1 << 20, fd, seccomp_fd=filter_fd) + [interpreter(), "-I", "-S", "-B", "-c", _PROBE],
                              capture_output=True, text=True, timeout=30, pass_fds=fds, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as error:
        return {"ok": False, "reason": f"bubblewrap could not start: {error}", "version": version}
    finally:
        if fd is not None:
            _POOL.release(fd)
        if filter_fd is not None:
            os.close(filter_fd)
    if done.returncode != 0:
        return {"ok": False, "reason": f"bubblewrap failed: {done.stderr.strip()[-400:]}", "version": version}
    seen = json.loads(done.stdout)
    problems = [text for bad, text in (
        (0 in seen["uid"] or 0 in seen["gid"] or seen["groups"], "the candidate would keep uid/gid 0 or groups"),
        (seen["cap_eff"].strip("0"), f"the candidate would keep capabilities ({seen['cap_eff']})"),
        (seen["no_new_privs"] != "1", "no_new_privs is not set"), (seen["usr_writable"], "/usr is writable"),
        (filter_fd is not None and seen["seccomp"] != "2", "the seccomp filter is not in force"),
    ) if bad]
    if problems:
        return {"ok": False, "reason": "; ".join(problems), "version": version}
    return {"ok": True, "reason": "", "version": version, "host_uid": NOBODY if os.geteuid() == 0 else os.geteuid()}


def supported(level: str) -> bool:
    """Whether ``level`` works on this machine (``none`` always does)."""
    return level == "none" or (check_isolation_name(level) == "bwrap" and bool(bwrap_report()["ok"]))


def available_isolation() -> str:
    """The strongest isolation that works here: ``"bwrap"``, else ``SandboxUnavailableError``."""
    report = bwrap_report()
    if not report["ok"]:
        raise SandboxUnavailableError(
            f"The code sandbox cannot contain untrusted code on this machine: {report['reason']}. To fix it, {INSTALL_HINT}.")
    return "bwrap"


def check_isolation_name(value: object, where: str = "isolation") -> str:
    """``value`` as a level name (auto, bwrap, none), else a ValueError naming ``where``, the value and the fix."""
    level = str(value or "auto").strip().lower()
    if level in RETIRED:
        raise ValueError(f"{where}={value!r}: this level was removed because {RETIRED[level]}. Use 'auto' or 'bwrap' "
                         f"(bubblewrap) for containment, or 'none' to opt out of it explicitly.")
    if level not in LEVELS + ("auto",):
        raise ValueError(f"{where} must be one of auto, {', '.join(LEVELS)}; got {value!r}. Use 'auto' (bubblewrap, refused "
                         f"when missing) or 'none' (no containment, explicit opt-in).")
    return level


_warned = threading.Event()


def resolve_isolation(requested: str = "auto") -> str:
    """The level to use for ``requested`` (``$COMLRL_SANDBOX_ISOLATION`` overrides ``"auto"``).

    ``bwrap`` / ``auto`` must work here (else ``SandboxUnavailableError``); ``none`` warns once."""
    level = check_isolation_name(requested)
    forced = os.environ.get(ISOLATION_ENV, "").strip()
    if level == "auto" and forced:
        level = check_isolation_name(forced, f"${ISOLATION_ENV}")
    if level == "none":
        if not _warned.is_set():
            _warned.set()
            warnings.warn("comlrl sandbox: isolation='none' runs model-generated code on this machine without containment "
                          "(no namespaces; only resource limits and an in-process audit hook). Use it only for trusted code "
                          "or a throw-away machine.", SandboxIsolationWarning, stacklevel=3)
        return "none"
    return available_isolation()


def describe_isolation(level: str, requested: str) -> Dict[str, object]:
    """What the run record keeps of the isolation (plain JSON data)."""
    forced = os.environ.get(ISOLATION_ENV, "").strip()
    source = f"${ISOLATION_ENV}" if forced and str(requested or "auto").strip().lower() == "auto" else "argument"
    out: Dict[str, object] = {"level": level, "requested": requested, "source": source, "contained": level == "bwrap",
                              "reward_checker": "separate process; the candidate answers calls with plain data over pipes"}
    if level == "bwrap":
        report = bwrap_report()
        out.update(bwrap=report.get("version"), candidate_uid=NOBODY, candidate_host_uid=report.get("host_uid"),
                   namespaces=["user", "pid", "net", "ipc", "uts", "mount", "cgroup (where available)"],
                   capabilities="none; no_new_privs; no nested user namespaces", seccomp=seccomp.describe(),
                   file_system="read-only /usr and interpreter prefix; private tmpfs work dir; no home, /tmp, /etc, /run or datasets",
                   network="none (own network namespace: no IPv4, IPv6 or abstract unix sockets to the host)")
    else:
        out.update(candidate_uid=os.geteuid(),
                   warning="no containment: the candidate can read and harm what its uid can on this machine")
    return out
