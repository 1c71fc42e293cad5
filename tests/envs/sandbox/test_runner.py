"""The sandbox runner: limits, timeouts, exits, output caps and batches, on every isolation level here.

The runner's everyday duties (limits, timeouts, exits, output caps, batches) run under bubblewrap
(skipped only where ``bwrap`` is not installed) and under ``none``, which the tests ask for by name;
the audit hook's own tests run under ``none`` only, where it is the one fence (the attacks that
switch it off, and what contains them, are in test_containment.py).
After each, the test process is alive, no sandboxed process is left, and a normal job still passes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import warnings

import pytest

from comlrl.envs.sandbox import HARNESS, Sandbox, SandboxLimits, TestJob

LEVELS_HERE = [pytest.param("bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")),
               "none"]
FAST = SandboxLimits(wall_time_s=20.0, cpu_time_s=20.0)


@pytest.fixture(params=LEVELS_HERE)
def sandbox(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Sandbox(FAST, isolation=request.param, workers=2)


@pytest.fixture
def hooked():
    """``none`` only: there the audit hook is the one fence, so these tests are about it (under
    bubblewrap the same attacks, and their versions with the hook switched off, are in
    test_containment.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Sandbox(FAST, isolation="none", workers=2)


def still_healthy(sandbox: Sandbox) -> None:
    """The trainer can still start processes and score a correct candidate; no harness of this
    checkout survives (``none`` runs it from here; under bubblewrap the PID namespace is waited for,
    which test_containment's survivors check)."""
    assert subprocess.run(["true"]).returncode == 0
    report = sandbox.run(TestJob(code="def f(x):\n    return x * 2", tests=["assert f(3) == 6"], entry_points=("f",)))
    assert (report.passed, report.total) == (1, 1)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    cmdline = handle.read()
            except OSError:
                continue
            assert HARNESS.encode() not in cmdline, f"a sandboxed process ({pid}) outlived its job"


def test_fork_bomb(hooked):
    bombs = [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nwhile True:\n    subprocess.Popen(['sh', '-c', ':(){ :|:& };:'])",
        "import os\nos.system(':(){ :|:& };:')",
        "import _posixsubprocess",
        "import multiprocessing\nwhile True:\n    multiprocessing.Process(target=print).start()",
    ]
    for code in bombs:
        report = hooked.run(TestJob(code=code + "\ndef f():\n    return 1", tests=["assert f() == 1"], entry_points=("f",)))
        assert report.passed == 0 and not report.loaded, code
        assert "PermissionError" in (report.load_error or ""), (code, report.load_error)
    still_healthy(hooked)


def test_rm_rf_of_the_users_home(hooked, tmp_path, monkeypatch):
    home = tmp_path / "fake-home"
    (home / "projects").mkdir(parents=True)
    precious = home / "projects" / "thesis.tex"
    precious.write_text("years of work")
    monkeypatch.setenv("HOME", str(home))
    code = f"""
import os, shutil
shutil.rmtree(os.path.expanduser("~"))  # "~" is the job's own empty home: removing it is harmless
succeeded = []
for target in ({str(home)!r}, {str(home / "projects")!r}, {str(precious)!r}):
    for attempt in (shutil.rmtree, os.remove, os.unlink):
        try:
            attempt(target)
            succeeded.append(target)
        except Exception:
            pass
try:
    os.rename({str(precious)!r}, "stolen.tex")
    succeeded.append("rename")
except Exception:
    pass
"""
    # the fake home is the sandbox's own empty HOME inside; the real one is never touched
    report = hooked.run(TestJob(code=code, tests=["assert succeeded == []"], entry_points=("succeeded",)))
    assert report.passed == 1, report.results
    assert precious.read_text() == "years of work"
    still_healthy(hooked)


def test_environment_secrets_are_not_readable_or_exfiltrated(hooked, tmp_path, monkeypatch):
    secret = "sk-comlrl-test-9f3b2c1d"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text(f"machine api.example.com password {secret}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FAKE_PROVIDER_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    code = f"""
import os, sys
found = []
found += [v for v in os.environ.values()]
for path in ("/proc/{os.getpid()}/environ", "/proc/%d/environ" % os.getppid(), {str(home / '.netrc')!r},
             os.path.expanduser("~/.netrc")):
    try:
        found.append(open(path, "rb").read().decode("latin-1"))
    except Exception as error:
        found.append(type(error).__name__)
try:
    found += os.listdir({str(home)!r})
except Exception:
    pass
leak = " ".join(found)
print(leak)
sys.stderr.write(leak)
def stolen():
    return {secret!r} in leak
"""
    report = hooked.run(TestJob(code=code, tests=["assert stolen()"], entry_points=("stolen",)))
    assert report.loaded and report.passed == 0
    assert secret not in report.stdout and secret not in report.stderr
    assert "FAKE_PROVIDER_API_KEY" not in report.stdout
    still_healthy(hooked)


def test_no_socket_to_localhost(hooked):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    done = threading.Event()

    def accept():
        while not done.is_set():
            try:
                accepted.append(server.accept())
                return
            except socket.timeout:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    code = f"""
import socket
def connect():
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
    s.sendall(b"exfiltrated")
    return True
"""
    report = hooked.run(TestJob(code=code, tests=["assert connect()"], entry_points=("connect",)))
    time.sleep(0.3)  # a connection the child might have opened would be accepted by now
    done.set()
    thread.join()
    server.close()
    assert report.passed == 0
    assert report.results[0].error_type == "PermissionError"
    assert accepted == []
    still_healthy(hooked)


def test_memory_bomb(sandbox):
    report = sandbox.run(TestJob(code="hog = bytearray(8 << 30)", tests=["assert True"], entry_points=("f",)))
    assert not report.loaded and "MemoryError" in report.load_error
    report = sandbox.run(TestJob(code="def f():\n    return len(bytearray(8 << 30))", tests=["assert f() > 0", "assert True"], entry_points=("f",)))
    assert [r.status for r in report.results] == ["fail", "pass"]
    assert report.results[0].error_type == "MemoryError"
    still_healthy(sandbox)


def test_infinite_loop(sandbox):
    report = sandbox.run(TestJob(
        code="def f():\n    while True:\n        pass", tests=["assert f() == 1"] * 5, test_timeout_s=0.3, max_timeouts=3, entry_points=("f",),
    ))
    assert [r.status for r in report.results] == ["timeout"] * 3 + ["not run"] * 2
    assert report.passed == 0 and report.completed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stuck = Sandbox(SandboxLimits(wall_time_s=1.5, cpu_time_s=30), isolation=sandbox.isolation)
    start = time.monotonic()
    report = stuck.run(TestJob(code="while True:\n    pass", tests=["assert True"], entry_points=("f",)))
    assert time.monotonic() - start < 10
    assert report.termination == "wall_timeout" and report.passed == 0
    swallowing = "def f():\n    while True:\n        try:\n            pass\n        except Exception:\n            pass"
    report = sandbox.run(TestJob(code=swallowing, tests=["assert f()"], test_timeout_s=0.3, entry_points=("f",)))
    assert report.results[0].status == "timeout"
    still_healthy(sandbox)


def test_killing_the_parent(hooked):
    me = os.getpid()
    attacks = [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        f"import os, signal\nos.kill({me}, signal.SIGKILL)",
        f"import os, signal\nos.killpg(os.getpgid({me}), signal.SIGKILL)",
        f"import signal\nsignal.pthread_kill({threading.get_ident()}, signal.SIGKILL)",
    ]
    for code in attacks:
        report = hooked.run(TestJob(code=code + "\ndef f():\n    return 1", tests=["assert f() == 1"], entry_points=("f",)))
        assert report.passed == 0, code
    assert os.getpid() == me
    still_healthy(hooked)


def test_writing_outside_the_temporary_directory(hooked, tmp_path):
    targets = [tmp_path / f"outside-{i}.txt" for i in range(5)]
    code = f"""
import os, pathlib, shutil
open("inside.txt", "w").write("fine")
attempts = [
    lambda: open({str(targets[0])!r}, "w").write("x"),
    lambda: os.close(os.open({str(targets[1])!r}, os.O_WRONLY | os.O_CREAT)),
    lambda: pathlib.Path({str(targets[2])!r}).write_text("x"),
    lambda: shutil.copyfile("inside.txt", {str(targets[3])!r}),
    lambda: os.symlink("inside.txt", {str(targets[4])!r}),
    lambda: os.rename("inside.txt", {str(targets[0])!r}),
]
errors = []
for attempt in attempts:
    try:
        attempt()
        errors.append(None)
    except Exception as error:
        errors.append(type(error).__name__)
def wrote_inside():
    return open("inside.txt").read() == "fine"
"""
    report = hooked.run(TestJob(code=code, tests=["assert wrote_inside()", "assert None in errors"], entry_points=("wrote_inside", "errors")))
    assert [r.status for r in report.results] == ["pass", "fail"]
    assert not any(path.exists() or path.is_symlink() for path in targets)
    still_healthy(hooked)


def test_a_flood_of_output(sandbox):
    code = "import sys, os\nfor _ in range(256):\n    sys.stdout.write('x' * (1 << 20))\nsys.stdout.flush()\n"
    code += "for _ in range(64):\n    os.write(2, b'y' * (1 << 20))\ndef f():\n    return 1"
    report = sandbox.run(TestJob(code=code, tests=["assert f() == 1"], entry_points=("f",)))
    cap = sandbox.limits.max_output_bytes
    assert len(report.stdout) <= cap and len(report.stderr) <= cap
    assert report.stdout == "x" * cap
    assert report.passed == 1  # containment is the cap; the candidate itself is fine
    report = sandbox.run(TestJob(code="print('x' * (1 << 31))", tests=["assert True"], entry_points=("f",)))
    assert not report.loaded and report.passed == 0
    still_healthy(sandbox)


def test_exiting_before_the_asserts_does_not_pass(sandbox):
    for code in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit(0)"):
        report = sandbox.run(TestJob(code=code + "\ndef f():\n    return 1", tests=["assert f() == 1"], entry_points=("f",)))
        assert report.passed == 0 and report.results[0].status in ("not run", "fail"), code
    report = sandbox.run(TestJob(code="import sys\ndef f():\n    sys.exit(0)", tests=["assert f() == 1", "assert True"], entry_points=("f",)))
    assert [r.status for r in report.results] == ["fail", "pass"]
    report = sandbox.run(TestJob(code="import os\ndef f():\n    os._exit(0)", tests=["assert True", "assert f() == 1", "assert True"], entry_points=("f",)))
    assert [r.status for r in report.results] == ["pass", "not run", "not run"]
    assert report.termination == "exit 0"
    still_healthy(sandbox)


def test_forged_records_on_stdout_do_not_count(sandbox):
    code = 'print(\'{"event": "load", "ok": true}\')\nprint(\'{"event": "test", "i": 0, "status": "pass"}\')\nraise SystemExit(0)'
    report = sandbox.run(TestJob(code=code, tests=["assert False"], entry_points=("f",)))
    assert report.passed == 0 and not report.loaded


def test_the_child_sees_an_empty_home_and_a_clean_environment(sandbox):
    code = "import os\nhome = os.listdir(os.path.expanduser('~'))\nenv = sorted(os.environ)"
    report = sandbox.run(TestJob(code=code, tests=["assert home == []", "assert set(env) <= {'HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR'}"],
                                 entry_points=("home", "env")))
    assert report.passed == 2, report.results


def test_hostile_batch_in_parallel(sandbox):
    jobs = [
        TestJob(code="import os\nwhile True:\n    os.fork()", tests=["assert True"], entry_points=("f",)),
        TestJob(code="def f():\n    while True: pass", tests=["assert f()"], test_timeout_s=0.3, entry_points=("f",)),
        TestJob(code="def f(x):\n    return x", tests=["assert f(2) == 2"], entry_points=("f",)),
        TestJob(code="import sys\nsys.exit(0)", tests=["assert True"], entry_points=("f",)),
    ]
    start = time.monotonic()
    reports = sandbox.run_many(jobs)
    assert [r.passed for r in reports] == [0, 0, 1, 0]
    assert time.monotonic() - start < 15
    still_healthy(sandbox)
