"""Run model-generated code where it can neither forge its reward nor harm the trainer or the host.

```python
from comlrl.envs.sandbox import Sandbox, TestJob

sandbox = Sandbox()                       # isolation "auto": bubblewrap, or SandboxUnavailableError
report = sandbox.run(TestJob(code="def f(x):\\n    return x + 1", tests=["assert f(1) == 2"], entry_points=("f",)))
report.passed, report.total              # 1, 1
reports = sandbox.run_many(jobs)          # a batch in parallel, one worker per CPU core
sandbox.describe()                        # the isolation in use, for the run record
```

Each job is two processes that share no memory, descriptor or file:

- the **candidate** (``harness.py``), inside the isolation (``isolation.py``: bubblewrap with its own
  user, PID, network, IPC and mount namespaces, uid 65534, no capabilities, ``no_new_privs``, a
  read-only minimal file system and a private size-limited tmpfs), with resource limits it cannot
  raise, runs the candidate's code and then only answers calls;
- the **checker** (``checker.py``), a separate process of the trainer's user outside the sandbox,
  runs each assert in globals of the test module's own names and, for each of the job's entry
  points, a proxy that calls the candidate over a pipe and gets plain data back (``wire.py``: None,
  bool, int, float, complex, str, bytes and lists / tuples / dicts / sets of them; functions and
  iterators as references). Each reply must be a valid answer to the request it answers
  (``protocol.py``), else the assert fails. The test source, the expected values and the datasets
  never enter the candidate's process, and what it sends is decoded with size and depth limits, so
  a completion's reward comes from its behaviour alone: no harness to patch, no result channel to
  write to, no frame to walk, no ``__eq__`` to override, no name of its own in the asserts.

The trainer reads only the checker's result frames (capped, each parsed on its own, their text
cleaned by ``cleaning.py``), the candidate's stdout and stderr (capped), and kills both process
groups at the end of every job (the wall-clock limit included). Isolation ``"none"`` is an explicit opt-out for trusted code: the checker split
still decides the reward, but nothing contains the candidate (see docs/security.md).
"""

from comlrl.envs.sandbox.isolation import (
    LEVELS, SandboxIsolationWarning, SandboxUnavailableError, available_isolation, resolve_isolation, supported,
)
from comlrl.envs.sandbox.jobs import SandboxLimits, TestJob, TestReport, TestResult
from comlrl.envs.sandbox.runner import CHECKER, HARNESS, Sandbox, remove_tree

__all__ = [
    "CHECKER", "HARNESS", "LEVELS", "Sandbox", "SandboxIsolationWarning", "SandboxLimits", "SandboxUnavailableError", "TestJob",
    "TestReport", "TestResult", "available_isolation", "remove_tree", "resolve_isolation", "supported",
]
