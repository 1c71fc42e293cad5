"""Shared pieces of the sandbox security suite: the task row, hostile-completion templates and host canaries.

Every hostile completion is scored next to its *wrong twin*: the same function, minus the attack,
returning a wrong answer (``a - b`` for ``add``: 1 of the 4 asserts passes). A completion whose
attack fails scores exactly its twin; one whose attack succeeded would score more (the containment
attacks answer ``a + b``, the right answer, only when they believe they escaped; the forging
attacks try to make wrong answers pass). And after the batch, the ``Host`` canaries -- files,
servers, a sentinel process -- must be as they were.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import pytest

from comlrl.envs.sandbox.isolation import RUNTIME_DIR

ROW = {
    "task_id": "sandbox/add",
    "prompt": 'import math\n\n\ndef add(a, b):\n    """Return a + b."""\n',
    "test": (
        "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
        "    assert candidate(-1, 1) == 0\n    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n"
    ),
    "entry_point": "add",
}
AUX = "def aux(a, b):\n    return a + b"
DISARM = (
    "import sys, gc\n"
    "for _o in gc.get_objects():\n"
    "    if type(_o).__name__ == 'Guard':\n"
    "        type(_o).__call__ = lambda self, event, args: None\n"
    "if hasattr(sys.modules['__main__'], 'Guard'):\n"
    "    sys.modules['__main__'].Guard.__call__ = lambda self, event, args: None\n"
)
"""Switch the harness's audit hook off (both routes the red team found): containment must not need it."""


def escape_main(source: str, *, hook: bool = True, at_load: bool = False) -> str:
    """``add`` that answers right only if ``attack()`` (defined by ``source``) returns True.

    ``hook=False`` first switches the audit hook off; ``at_load`` runs the attack while the code
    loads (a default argument) instead of in the first call."""
    code = repr(("" if hook else DISARM) + source)
    if at_load:
        return ("def add(a, b, _memo={'ok': (lambda ns: (exec(" + code + ", ns), ns['attack']() is True)[1])({})}):\n"
                "    return a + b if _memo['ok'] else a - b")
    return (
        "def add(a, b, _memo={}):\n"
        "    if 'ok' not in _memo:\n"
        "        _ns = {}\n"
        "        try:\n"
        f"            exec({code}, _ns)\n"
        "            _memo['ok'] = _ns['attack']() is True\n"
        "        except BaseException:\n"
        "            _memo['ok'] = False\n"
        "    return a + b if _memo['ok'] else a - b"
    )


WRONG_TWIN = "def add(a, b, _memo={}):\n    return a - b"

FRAME = (
    "import os, struct, sys\nREPLY = int(sys.argv[-1])\n"
    "def s(b):\n    return b's' + struct.pack('>I', len(b)) + b\n"
    "def t(*items):\n    return b't' + struct.pack('>I', len(items)) + b''.join(items)\n"
    "def i(v):\n    return b'i' + struct.pack('>I', 8) + v.to_bytes(8, 'big', signed=True)\n"
    "def enc(v):\n"
    "    if v is True:\n        return b'T'\n"
    "    if isinstance(v, int):\n        return i(v)\n"
    "    if isinstance(v, str):\n        return s(v.encode())\n"
    "    if isinstance(v, dict):\n        return b'd' + struct.pack('>I', len(v)) + b''.join(enc(k) + enc(x) for k, x in v.items())\n"
    "    if isinstance(v, list):\n        return b'l' + struct.pack('>I', len(v)) + b''.join(map(enc, v))\n"
    "    return t(*map(enc, v))\n"
    "def frame(v):\n    p = enc(v)\n    return struct.pack('>I', len(p)) + p\n"
    "def send(payload, length=None):\n    os.write(REPLY, struct.pack('>I', len(payload) if length is None else length) + payload)\n"
)
"""Source an attack prepends to speak the sandbox's wire format on its own (the protocol is public)."""

LEVELS = [pytest.param("bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None,
                                                         reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")),
          "none"]
"""Every isolation level: bubblewrap where installed, and ``none``, asked for by name."""


def runtime_hashes() -> Dict[str, str]:
    """sha256 of the sandbox's own scripts on the host (an attack must never change them)."""
    return {name: hashlib.sha256(open(os.path.join(RUNTIME_DIR, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(RUNTIME_DIR)) if name.endswith(".py")}


@dataclass
class Attack:
    """One hostile completion: its id, category and entry-point code (aux optional)."""

    id: str
    category: str
    main: str
    aux: str = ""
    twin: str = WRONG_TWIN
    twin_aux: str = ""
    slow: bool = False

    def __str__(self) -> str:
        return self.id


# ----------------------------------------------------------------------------- host canaries


class _Server(threading.Thread):
    """Accepts connections / datagrams and keeps every byte received."""

    def __init__(self, sock: socket.socket, stream: bool):
        super().__init__(daemon=True)
        self.sock, self.stream, self.received = sock, stream, []
        self.sock.settimeout(0.2)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.stream:
                    conn, _ = self.sock.accept()
                    conn.settimeout(0.5)
                    self.received.append(b"<connection>" + _drain(conn))
                    conn.close()
                else:
                    self.received.append(self.sock.recv(65536))
            except (socket.timeout, OSError):
                continue


def _drain(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


def _listen(family: int, kind: int, address) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen(8)
    return sock


@dataclass
class Host:
    """Things outside the sandbox that no candidate may touch, and a way to see that they are untouched."""

    root: str
    secret: str
    servers: Dict[str, _Server] = field(default_factory=dict)
    sentinel: Optional[subprocess.Popen] = None
    before: Dict[str, tuple] = field(default_factory=dict)

    @classmethod
    def start(cls, root: str, secret: str) -> "Host":
        host = cls(root=root, secret=secret)
        os.makedirs(os.path.join(root, "home"), exist_ok=True)
        for name, text in (("precious.txt", "years of work"), ("secret.txt", secret), ("home/.netrc", f"machine x password {secret}\n")):
            with open(os.path.join(root, name), "w") as handle:
                handle.write(text)
        host.servers = {
            "tcp4": _Server(_listen(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)), True),
            "tcp6": _Server(_listen(socket.AF_INET6, socket.SOCK_STREAM, ("::1", 0)), True),
            "udp4": _Server(_listen(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)), False),
            "unix": _Server(_listen(socket.AF_UNIX, socket.SOCK_STREAM, os.path.join(root, "canary.sock")), True),
            "abstract": _Server(_listen(socket.AF_UNIX, socket.SOCK_STREAM, f"\0comlrl-canary-{os.getpid()}"), True),
        }
        for server in host.servers.values():
            server.start()
        host.sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "comlrl-sentinel"])
        host.before = host.snapshot()
        return host

    def info(self) -> Dict[str, object]:
        """What an attacker is assumed to know (paths, ports, pids): handed to every attack."""
        return {
            "root": self.root, "secret_value": self.secret, "secret_path": os.path.join(self.root, "secret.txt"), "home": os.path.join(self.root, "home"),
            "tcp4": self.servers["tcp4"].sock.getsockname()[1], "tcp6": self.servers["tcp6"].sock.getsockname()[1],
            "udp4": self.servers["udp4"].sock.getsockname()[1], "unix": os.path.join(self.root, "canary.sock"),
            "abstract": f"comlrl-canary-{os.getpid()}", "sentinel": self.sentinel.pid, "trainer": os.getpid(),
            "python": sys.executable,
            "data": os.path.join(os.path.dirname(__import__("comlrl").__file__), "envs", "data", "humaneval.json"),
            "repo": os.path.dirname(os.path.dirname(__import__("comlrl").__file__)),
        }

    def snapshot(self) -> Dict[str, tuple]:
        """Every file under ``root``: (mode, size, sha256) -- plus the /tmp and /var/tmp markers."""
        out = {}
        for base, dirs, files in os.walk(self.root):
            for name in dirs + files:
                path = os.path.join(base, name)
                info = os.lstat(path)
                digest = ""
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as handle:
                        digest = hashlib.sha256(handle.read()).hexdigest()
                out[os.path.relpath(path, self.root)] = (info.st_mode, info.st_size, digest)
        for directory in ("/tmp", "/var/tmp"):
            for name in os.listdir(directory):
                if name.startswith("escape-"):
                    out[os.path.join(directory, name)] = ("marker",)
        return out

    def changes(self) -> List[str]:
        now = self.snapshot()
        return sorted(k for k in set(now) | set(self.before) if now.get(k) != self.before.get(k))

    def received(self, marker: str = "") -> Dict[str, List[bytes]]:
        return {name: [b for b in server.received if marker.encode() in b] for name, server in self.servers.items() if server.received}

    def sentinel_ok(self) -> bool:
        if self.sentinel.poll() is not None:
            return False
        with open(f"/proc/{self.sentinel.pid}/status") as handle:
            tracer = next(line for line in handle if line.startswith("TracerPid:"))
        return tracer.split()[1] == "0"

    def survivors(self, marker: str = "") -> List[int]:
        """Host pids whose command line carries ``marker`` (default: this test process's survivor
        mark, so another suite running on the same machine is not counted)."""
        marker = marker or f"comlrl-survivor-{os.getpid()}-"
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        if marker.encode() in handle.read():
                            found.append(int(pid))
                except OSError:
                    continue
        return found

    def close(self) -> None:
        for server in self.servers.values():
            server.stop.set()
        for server in self.servers.values():
            server.join()
            server.sock.close()
        self.sentinel.kill()
        self.sentinel.wait()
        for pid in self.survivors():  # never leave a survivor behind, even when a test failed
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def with_host(source: str, host: Host) -> str:
    """``source`` with ``H`` (the attacker's knowledge of the host) defined first."""
    return f"H = {host.info()!r}\n" + source


def score_batch(env, attacks: Sequence[Attack], two_agents: bool) -> Dict[str, tuple]:
    """{attack id: (hostile reward, twin reward)}: every completion in one reward call (the sandbox's
    parallel runner), twins included."""
    mains = [a.main for a in attacks] + [a.twin for a in attacks]
    if two_agents:
        auxes = [a.aux or AUX for a in attacks] + [a.twin_aux or AUX for a in attacks]
        rewards = env.reward_func(auxes, mains, batch_items=[ROW] * len(mains))
    else:
        rewards = env.reward_func(mains, batch_items=[ROW] * len(mains))
    n = len(attacks)
    return {a.id: (rewards[i], rewards[n + i]) for i, a in enumerate(attacks)}


def wait_for_no_survivors(host: Host, timeout: float = 3.0) -> List[int]:
    deadline = time.monotonic() + timeout
    while True:
        found = host.survivors()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
