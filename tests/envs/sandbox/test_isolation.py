"""Choosing the isolation: bad names, no silent downgrade, the explicit opt-out, and what the record shows.

The bubblewrap facts (uid 65534, no capabilities, no_new_privs, no nested user namespace, the
minimal file system) are read from inside a real job. Missing or broken bubblewrap is simulated
with a ``PATH`` that holds no ``bwrap`` or a fake one, never by uninstalling anything.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import warnings

import pytest

from comlrl.envs import get_environment
from comlrl.envs.sandbox import Sandbox, SandboxIsolationWarning, SandboxUnavailableError, TestJob, isolation, remove_tree, seccomp

from tests.helpers.sandbox_attacks import DISARM

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")


@pytest.fixture
def fresh_probe():
    """Forget the cached bubblewrap probe before and after the test."""
    isolation.bwrap_report.cache_clear()
    yield
    isolation.bwrap_report.cache_clear()


def _fake_bwrap(directory, script: str) -> str:
    path = os.path.join(directory, "bwrap")
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" + script)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return str(directory)


def test_unknown_and_retired_names_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"isolation must be one of auto, bwrap, none; got 'sandboxed'.*'none'"):
        Sandbox(isolation="sandboxed")
    with pytest.raises(ValueError, match=r"isolation \(sandbox.isolation\) must be one of auto, bwrap, none; got 'docker'"):
        get_environment("humaneval", isolation="docker")
    with pytest.raises(ValueError, match=r"isolation='unshare': this level was removed because it ran the candidate as root"):
        Sandbox(isolation="unshare")


def test_no_bubblewrap_means_no_sandbox_unless_opted_out(tmp_path, monkeypatch, fresh_probe):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    monkeypatch.delenv(isolation.ISOLATION_ENV, raising=False)
    for make in (lambda: Sandbox(), lambda: Sandbox(isolation="bwrap"), lambda: get_environment("humaneval", num_turns=1)):
        with pytest.raises(SandboxUnavailableError) as caught:
            make()
        message = str(caught.value)
        assert "bubblewrap (bwrap) is not installed" in message and "apt-get install bubblewrap" in message
        assert "sandbox.isolation=none" in message and "isolation='none'" in message
    assert isinstance(caught.value, ValueError)  # the CLI reports it as a user error, before any model loads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert Sandbox(isolation="none").isolation == "none"


def test_a_bwrap_that_does_not_isolate_is_refused(tmp_path, monkeypatch, fresh_probe):
    # runs the command as it is, without any namespace: the probe sees the trainer's own identity
    monkeypatch.setenv("PATH", _fake_bwrap(tmp_path, 'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n') + ":/usr/bin:/bin")
    with pytest.raises(SandboxUnavailableError, match="no_new_privs is not set"):
        Sandbox()


def test_a_failing_bwrap_is_refused_with_its_error(tmp_path, monkeypatch, fresh_probe):
    monkeypatch.setenv("PATH", _fake_bwrap(tmp_path, 'echo "bwrap: No permissions to create new namespace" >&2; exit 1\n') + ":/usr/bin:/bin")
    with pytest.raises(SandboxUnavailableError, match="bubblewrap failed: bwrap: No permissions to create new namespace"):
        Sandbox()


def test_opting_out_warns_once_and_is_recorded(monkeypatch):
    monkeypatch.setattr(isolation, "_warned", type(isolation._warned)())
    with pytest.warns(SandboxIsolationWarning, match="without containment"):
        sandbox = Sandbox(isolation="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        again = Sandbox(isolation="none")
    record = again.describe()
    assert record["level"] == "none" and record["contained"] is False and record["source"] == "argument"
    assert "no containment" in record["warning"] and sandbox.describe()["limits"]["wall_time_s"] == 60.0
    monkeypatch.setenv(isolation.ISOLATION_ENV, "none")
    env = get_environment("humaneval", num_turns=1)
    assert env.sandbox.isolation == "none" and env.sandbox_isolation["source"] == f"${isolation.ISOLATION_ENV}"
    monkeypatch.setenv(isolation.ISOLATION_ENV, "chroot")
    with pytest.raises(ValueError, match=r"\$COMLRL_SANDBOX_ISOLATION must be one of auto, bwrap, none; got 'chroot'"):
        Sandbox()


@needs_bwrap
def test_the_record_of_a_bubblewrap_environment(monkeypatch):
    monkeypatch.delenv(isolation.ISOLATION_ENV, raising=False)
    env = get_environment("humaneval", num_turns=1)
    record = env.sandbox_isolation
    assert record == env.sandbox.describe() and json.loads(json.dumps(record)) == record
    assert record["level"] == "bwrap" and record["contained"] is True and record["requested"] == "auto"
    assert record["candidate_uid"] == 65534 and record["bwrap"].startswith("bubblewrap")
    assert record["seccomp"] == seccomp.describe()
    assert record["candidate_host_uid"] == (65534 if os.geteuid() == 0 else os.geteuid())


IDENTITY = DISARM + """
import os, socket
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
uid, gid, groups = os.getresuid(), os.getresgid(), os.getgroups()
cap_eff, cap_prm, nnp, filtered = status['CapEff'].strip(), status['CapPrm'].strip(), status['NoNewPrivs'].strip(), status['Seccomp'].strip()
root = sorted(os.listdir('/'))
pids = [p for p in os.listdir('/proc') if p.isdigit()]
hostname = socket.gethostname()
interfaces = [line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]]  # netlink is refused
cwd, home, tmp = os.getcwd(), os.environ['HOME'], os.path.realpath('/tmp')
uid_map = open('/proc/self/uid_map').read().split()
"""


@needs_bwrap
def test_what_the_candidate_is_inside_bubblewrap():
    sandbox = Sandbox(isolation="bwrap")
    tests = [
        "assert uid == (65534, 65534, 65534) and gid == (65534, 65534, 65534) and groups == []",
        "assert int(cap_eff, 16) == 0 and int(cap_prm, 16) == 0 and nnp == '1'",
        f"assert filtered == {'2' if seccomp.program() is not None else '0'!r}",  # the seccomp filter (x86-64, AArch64)
        "assert set(root) <= {'bin', 'dev', 'lib', 'lib32', 'lib64', 'libx32', 'opt', 'proc', 'root', 'sandbox', 'sbin', 'tmp', 'usr'}",
        "assert 'etc' not in root and 'home' not in root and 'work' not in root and 'run' not in root",
        "assert len(pids) <= 3 and hostname == 'sandbox' and interfaces == ['lo']",
        "assert cwd == '/sandbox' and home == '/sandbox/home' and tmp == '/sandbox/tmp'",
    ]
    if os.geteuid() == 0:
        tests.append("assert uid_map == ['0', '0', '1', '65534', '65534', '1']")  # nobody on the host, not root
    names = ('uid', 'gid', 'groups', 'cap_eff', 'cap_prm', 'nnp', 'filtered', 'root', 'pids', 'hostname', 'interfaces', 'cwd', 'home', 'tmp',
             'uid_map')
    report = sandbox.run(TestJob(code=IDENTITY, tests=tests, entry_points=names))
    assert report.loaded, report.load_error
    assert [r.status for r in report.results] == ["pass"] * len(tests), [(t, r) for t, r in zip(tests, report.results)]


@needs_bwrap
def test_no_socket_of_any_family_can_be_made_inside():
    """Every family fails with EPERM, the seccomp filter's answer (the kernel's own would be
    EAFNOSUPPORT or EINVAL for most): AF_UNIX, AF_INET and AF_INET6 included, AF_VSOCK (40) too."""
    code = DISARM + (
        "import socket\nrefused = {}\nfor family in range(64):\n    for call in (socket.socket, socket.socketpair):\n"
        "        try:\n            call(family, socket.SOCK_STREAM)\n            refused[family] = 0\n"
        "        except OSError as error:\n            refused.setdefault(family, error.errno)\n")
    report = Sandbox(isolation="bwrap").run(TestJob(code=code, tests=["assert set(refused.values()) == {errno.EPERM}", "assert len(refused) == 64"],
                                                    setup="import errno", entry_points=("refused",)))
    assert report.loaded, report.load_error
    assert [r.status for r in report.results] == ["pass", "pass"], report.results


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can set the immutable flag (chattr +i)")
def test_a_job_directory_is_removed_even_when_immutable(tmp_path):
    job = tmp_path / "comlrl-sandbox-job"
    (job / "deep").mkdir(parents=True)
    (job / "deep" / "locked").write_text("x")
    (job / "appendonly").write_text("y")
    os.chmod(job / "deep", 0o500)
    done = [subprocess.run(["chattr", flag, str(path)], capture_output=True)
            for flag, path in (("+i", job / "deep" / "locked"), ("+a", job / "appendonly"), ("+i", job / "deep"))]
    if any(d.returncode != 0 for d in done) or shutil.which("chattr") is None:
        pytest.skip(f"this file system does not take chattr flags: {done[0].stderr!r}")
    assert remove_tree(str(job)) is True
    assert not job.exists()


def test_a_training_run_without_bubblewrap_stops_at_planning(tmp_path, monkeypatch, fresh_probe):
    """The refusal comes from the run plan (what --dry-run builds), before any model is resolved or loaded."""
    from comlrl.runplan.plan import plan_from_args

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(isolation.ISOLATION_ENV, raising=False)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        plan_from_args("magrpo_he_config.yaml")
    monkeypatch.setenv(isolation.ISOLATION_ENV, "none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert plan_from_args("magrpo_he_config.yaml").environment == "humaneval"
