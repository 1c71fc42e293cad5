"""The ClassEval reward of OpenMLRL/LLM_Collab_Code_Completion (``rewards/CE_reward.py``), max 6.

For one joint response (one completion per agent) and a row with ``skeleton`` and ``test``:

    merge    each incomplete method's snippet from the agent it is assigned to, kept when it parses
             on its own, replaces the method's stub in the skeleton (``source.py``)
    level 1  2 x (methods kept / incomplete methods)
    level 2  4 x (tests passed / tests run): the merged class runs in the sandbox; the test module's
             unittest tests run in the sandbox's checker process against a proxy of the class
             (``unittest`` jobs), 40 s per test, the rest skipped after 3 timeouts (they do not
             count as run); a job the candidate did not see through (it exited, broke the protocol
             or ran past the wall-clock limit, the original's crashed or killed runner) counts 0
    level 3  -(methods written by more than one agent) / incomplete methods
    total    level 1 + level 2 + level 3, and 0 -- every level 0 -- when the merged class and the
             test module do not compile together

``reward_details`` gives the levels under the task repository's evaluation names
(``ce_reward/level1_syntax``, ``ce_reward/level2_tests``, ``ce_reward/level3_overlap_penalty``,
``ce_reward/total``; the trainers log them as ``eval/ce_reward/...``), ``reward`` (the total), and
the counts behind them: ``compiles``, ``methods_total``, ``methods_valid``, ``methods_overlapping``,
``tests_total``, ``tests_run``, ``tests_passed``, ``tests_timeouts``, ``tests_completed``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from comlrl.envs.base import DetailCache
from comlrl.envs.coding.analysis import PARSE_ERRORS
from comlrl.envs.coding.classeval import source
from comlrl.envs.coding.rewards import guarded
from comlrl.envs.sandbox import Sandbox, TestJob, TestReport

SYNTAX_WEIGHT, TESTS_WEIGHT = 2.0, 4.0
LEVEL_KEYS = ("ce_reward/level1_syntax", "ce_reward/level2_tests", "ce_reward/level3_overlap_penalty", "ce_reward/total")
COUNT_KEYS = ("compiles", "methods_total", "methods_valid", "methods_overlapping", "tests_total", "tests_run", "tests_passed",
              "tests_timeouts", "tests_completed")


@dataclass(frozen=True)
class ClassTask:
    """What the reward and the feedback need of one row (computed once per row)."""

    skeleton: str
    test: str
    class_name: str
    methods: Tuple[str, ...]
    """The incomplete methods, in the skeleton's order."""
    parts: Tuple[Tuple[str, int], ...]
    """(method, agent) pairs of the partition."""
    test_ids: Tuple[str, ...]
    setup: str
    """The checker's test module: the skeleton's imports, then the row's test code."""
    entry_points: Tuple[str, ...]

    @property
    def partition(self) -> Dict[str, int]:
        return dict(self.parts)


@dataclass(frozen=True)
class TestSettings:
    """How the tests of a job run."""

    __test__ = False
    test_timeout_s: float = 40.0
    max_timeouts: int = 3


@dataclass(frozen=True)
class Merged:
    """One joint response merged into the skeleton."""

    code: str
    valid: int
    overlap: int
    compiles: bool


def task_of(row: Mapping[str, Any], num_agents: int) -> ClassTask:
    """The row's task; a row without a skeleton and a test module that parses is refused."""
    try:
        skeleton, test = row["skeleton"], row["test"]
    except (KeyError, TypeError):
        raise ValueError(f"A ClassEval row needs 'skeleton' and 'test' fields; got {row!r:.120}.") from None
    if not isinstance(skeleton, str) or not isinstance(test, str):
        raise ValueError(f"A ClassEval row's skeleton and test must be strings; got {row!r:.120}.")
    return _task(skeleton, test, num_agents)


@functools.lru_cache(maxsize=256)
def _task(skeleton: str, test: str, num_agents: int) -> ClassTask:
    try:
        ids = source.test_ids(test)
    except PARSE_ERRORS as error:
        raise ValueError(f"A ClassEval row's test is not a Python module ({type(error).__name__}: {error}); "
                         f"it must be unittest code, as in FudanSELab/ClassEval.") from None
    class_name = source.class_name_of(skeleton) or ""
    setup = "\n".join(part for part in (source.skeleton_imports(skeleton), test) if part)
    parts = tuple(source.partition(skeleton, num_agents).items())
    return ClassTask(skeleton, test, class_name, tuple(source.incomplete_methods(skeleton)), parts, tuple(ids), setup,
                     source.defined_names(skeleton, class_name))


def merge_joint(task: ClassTask, texts: Sequence[str]) -> Merged:
    """Select, merge and compile-check one joint response (the original compiles the merged class
    followed by the test module)."""
    selected = source.select_methods(texts, task.partition)
    code = source.merge(task.skeleton, task.class_name, selected)
    combined = code.rstrip() + "\n\n" + task.test.lstrip()
    return Merged(code, len(selected), source.overlapping(texts, task.methods), source.compiles(combined))


def test_job(task: ClassTask, merged: Merged, settings: TestSettings) -> Optional[TestJob]:
    """The sandbox job of a merged class (None: nothing to run)."""
    if not merged.compiles or not task.test_ids or not task.entry_points:
        return None
    return TestJob(code=merged.code, tests=task.test_ids, setup=task.setup, entry_points=task.entry_points, style="unittest",
                   test_timeout_s=settings.test_timeout_s, max_timeouts=settings.max_timeouts)


def test_reports(sandbox: Sandbox, jobs: Sequence[Optional[TestJob]], cache: DetailCache) -> List[Optional[TestReport]]:
    """Each job's report (None for no job): cached ones reused, the others run in one batch."""
    keys = [None if job is None else (job.code, job.setup, job.tests, job.test_timeout_s, job.max_timeouts) for job in jobs]
    missing = [i for i, key in enumerate(keys) if key is not None and cache.get(key) is None]
    if missing:
        for i, report in zip(missing, sandbox.run_many([jobs[i] for i in missing])):
            cache.put(keys[i], report)
    return [None if key is None else cache.get(key) for key in keys]


def test_counts(report: Optional[TestReport]) -> Tuple[int, int, int, bool]:
    """(tests run, passed, timeouts, completed) of a report (tests not run do not count)."""
    if report is None:
        return 0, 0, 0, False
    run = sum(result.status != "not run" for result in report.results)
    return run, report.passed, report.timeouts, bool(report.loaded and report.completed)


def details(task: ClassTask, merged: Merged, report: Optional[TestReport]) -> Dict[str, float]:
    """The breakdown of one joint response (see the module docstring)."""
    total_methods = len(task.methods)
    run, passed, timeouts, completed = test_counts(report)
    out = {"compiles": float(merged.compiles), "methods_total": float(total_methods), "methods_valid": float(merged.valid),
           "methods_overlapping": float(merged.overlap), "tests_total": float(len(task.test_ids)), "tests_run": float(run),
           "tests_passed": float(passed), "tests_timeouts": float(timeouts), "tests_completed": float(completed)}
    levels = [0.0, 0.0, 0.0]
    if merged.compiles:
        if total_methods:
            levels[0] = SYNTAX_WEIGHT * (merged.valid / total_methods)
            levels[2] = 0.0 - merged.overlap / total_methods  # 0.0, never -0.0, without overlap
        if completed and run:
            levels[1] = TESTS_WEIGHT * passed / run
    total = float(levels[0] + levels[1] + levels[2])
    out.update(zip(LEVEL_KEYS, [*levels, total]))
    out["reward"] = total
    return out


def failed_details() -> Dict[str, float]:
    """The breakdown of a joint response whose analysis failed: every term 0."""
    return dict.fromkeys((*COUNT_KEYS, *LEVEL_KEYS, "reward"), 0.0)


def classeval_details(joints: Sequence[Sequence[str]], rows: Sequence[Mapping[str, Any]], *, sandbox: Sandbox, num_agents: int,
                      settings: TestSettings, reports: DetailCache) -> List[Dict[str, float]]:
    """Reward breakdowns of joint responses; their tests run in ``sandbox`` in parallel."""
    tasks = [task_of(row, num_agents) for row in rows]  # a malformed row is the configuration's error: it raises
    merged = [guarded("classeval reward", merge_joint, task, joint) for task, joint in zip(tasks, joints)]
    jobs = [None if m is None else test_job(task, m, settings) for task, m in zip(tasks, merged)]
    found = test_reports(sandbox, jobs, reports)
    out = [None if m is None else guarded("classeval reward", details, task, m, report) for task, m, report in zip(tasks, merged, found)]
    return [d if d is not None else failed_details() for d in out]
