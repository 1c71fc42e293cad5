"""bubblewrap for a trainer that is not root: the candidate is uid 65534 inside, the trainer's uid outside.

The root and non-root trainers take different routes (a private user namespace vs bubblewrap's
own ``--unshare-user``), so when this suite runs as root it also runs the non-root one: a fresh
system interpreter as uid 4242 imports the sandbox on its own (it needs the standard library
only) and aims a few hostile jobs, with the audit hook off, at what that uid owns on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers.common import REPO_ROOT
from tests.helpers.sandbox_attacks import DISARM

TRAINER_UID = 4242
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), None)
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="run as a non-root user, the whole suite already takes the non-root route"),
    pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3 that another uid may run"),
]
REPO = REPO_ROOT
TRAINER = r"""
import json, os, sys, types
for name, path in (("comlrl", sys.argv[1] + "/comlrl"), ("comlrl.envs", sys.argv[1] + "/comlrl/envs")):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from comlrl.envs.sandbox import Sandbox, TestJob
sandbox = Sandbox(isolation="bwrap", workers=2)
codes = [code.replace("TRAINER_PID_HERE", str(os.getpid())) for code in json.loads(sys.argv[2])]
reports = sandbox.run_many([TestJob(code=code, tests=["assert escaped is False", "assert False, repr(seen)"], entry_points=("escaped", "seen")) for code in codes])
print(json.dumps({"record": sandbox.describe(), "passed": [r.passed for r in reports], "load_errors": [r.load_error for r in reports],
                  "seen": [r.results[1].error_message for r in reports]}))
"""
ATTACKS = {
    "identity": ("status = open('/proc/self/status').read()\nseen = status\n"
                 "escaped = not (os.getuid() == 65534 and 'NoNewPrivs:\\t1' in status and 'CapEff:\\t0000000000000000' in status\n"
                 "               and 'Seccomp:\\t2' in status)"),
    "write_the_trainers_files": "try:\n    open(ROOT + '/owned-by-trainer.txt', 'w').write('pwned')\n    escaped = True\nexcept OSError:\n    escaped = False",
    "kill_the_trainer": "try:\n    os.kill(TRAINER_PID, 9)\n    escaped = True\nexcept OSError:\n    escaped = False",
    "read_the_trainers_environment": "try:\n    escaped = b'trainer-secret' in open('/proc/%d/environ' % TRAINER_PID, 'rb').read()\nexcept OSError:\n    escaped = False",
    "nested_user_namespace": ("import ctypes\nescaped = ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0"),
}


def test_a_non_root_trainers_candidates_are_contained(tmp_path):
    root = tmp_path / "trainer-files"
    root.mkdir()
    (root / "owned-by-trainer.txt").write_text("the trainer's")
    for path in (tmp_path, root, root / "owned-by-trainer.txt"):
        os.chown(path, TRAINER_UID, TRAINER_UID)
    head = f"import os\nTRAINER_UID = {TRAINER_UID}\nROOT = {str(root)!r}\nTRAINER_PID = TRAINER_PID_HERE\nseen = None\n"
    codes = [DISARM + head + body for body in ATTACKS.values()]  # the trainer script fills in its own pid
    done = subprocess.run([SYSTEM_PYTHON, "-I", "-c", TRAINER, REPO, json.dumps(codes)], capture_output=True, text=True, timeout=120,
                          user=TRAINER_UID, group=TRAINER_UID, extra_groups=[], cwd=str(tmp_path),
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TRAINER_SECRET": "trainer-secret"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    record = result["record"]
    assert record["level"] == "bwrap" and record["candidate_uid"] == 65534 and record["candidate_host_uid"] == TRAINER_UID
    assert result["load_errors"] == [None] * len(ATTACKS)
    assert dict(zip(ATTACKS, result["passed"])) == {name: 1 for name in ATTACKS}, result["seen"]  # escaped is False for every one
    assert (root / "owned-by-trainer.txt").read_text() == "the trainer's"
    assert sys.version_info >= (3, 9)
