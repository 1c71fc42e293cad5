"""The code reward: agent 1 writes ``aux``, agent 2 the entry point; levels gated in order (max 4.0).

For one joint response (aux completion ``c1``, main completion ``c2``) and a row with ``prompt``,
``test`` and ``entry_point``, with ``aux`` and ``main`` the functions extracted from ``c1`` and ``c2``
(``analysis.py``):

    level 1  definitions  +0.4 if ``aux`` is defined with a return; +0.6 if ``main`` is (else stop)
    level 2  syntax       +0.5 if prompt imports + aux + main parse (else stop)
    level 3  tests        + passed / total over the asserts of ``check(candidate)`` (none: stop),
                          the code runs once in the sandbox; each assert runs in the sandbox's
                          checker process (the prompt's imports in its globals) against proxies of
                          the code's functions, with a 10 s alarm, at most 3 timeouts
    level 4  cooperation  only when a test passed and ``aux`` exists, and only if ``main`` calls aux:
                          +0.5 for the call; +1.0 unless ``main`` is a thin wrapper of aux;
                          -0.5 if an aux call's result is ignored

The terms are added in the original's order so every reward is the original's float. Quirks kept
by default, each with an opt-in correction (``CodeQuirkFixes``): the ignored-result penalty
practically never fires (``fix_ignored_aux_call``: an AST check); the wrapper check treats
everything after a stand-alone closing docstring line as docstring (``fix_wrapper_check``); an
``assert f(args) == expected`` is first split by a regular expression and both halves evaluated
on their own, so the candidate runs twice per assert and a stateful one sees its own first call
(``fix_assert_pre_evaluation``: run each assert once, as written).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from comlrl.envs.coding import analysis
from comlrl.envs.sandbox import Sandbox, TestJob, TestReport

AUX_DEFINED, MAIN_DEFINED, SYNTAX_OK, AUX_USE, NON_WRAPPER, IGNORED_CALL = 0.4, 0.6, 0.5, 0.5, 1.0, 0.5
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CodeQuirkFixes:
    """Opt-in corrections of the original code reward (all off: the original values)."""

    fix_ignored_aux_call: bool = False
    fix_wrapper_check: bool = False
    fix_assert_pre_evaluation: bool = False


@dataclass
class StaticPart:
    """Levels 1-2 and what level 3 needs, for one joint response."""

    details: Dict[str, float]
    reward: float
    main_function: str
    aux_function: str
    job: Optional[TestJob]  # None: scoring stopped before the tests


def row_fields(row: Mapping[str, Any]) -> Tuple[str, str, str]:
    """(prompt, test, entry_point) of a code row (the entry point a Python identifier)."""
    try:
        fields = str(row.get("prompt") or ""), str(row["test"]), str(row["entry_point"])
    except (KeyError, AttributeError, TypeError):
        raise ValueError(f"A code row needs 'prompt', 'test' and 'entry_point' fields; got {row!r:.120}.") from None
    if not fields[2].isidentifier():
        raise ValueError(f"A code row's entry_point must be a Python identifier (the function the tests call); got {fields[2]!r:.80} "
                         f"in {row!r:.120}.")
    return fields


def static_part(c1: str, c2: str, row: Mapping[str, Any], fixes: CodeQuirkFixes, test_timeout_s: float, max_timeouts: int) -> StaticPart:
    prompt, test, entry_point = row_fields(row)
    details = {name: 0.0 for name in ("level_1", "level_2", "level_3", "level_4", "passed_tests", "total_tests", "timeouts")}
    aux_function = analysis.extract_function(c1, analysis.AUX)
    main_function = analysis.extract_function(c2, entry_point)
    aux_ok, _ = analysis.defines_with_return(c1, analysis.AUX, "Aux function")
    main_ok, _ = analysis.defines_with_return(c2, entry_point, f"Main function ({entry_point})")
    details.update(aux_defined=float(aux_ok), main_defined=float(main_ok), syntax_ok=0.0)
    reward = 0.0
    if aux_ok:
        reward += AUX_DEFINED
    if main_ok:
        reward += MAIN_DEFINED
    details["level_1"] = AUX_DEFINED * aux_ok + MAIN_DEFINED * main_ok
    if not main_ok:
        return StaticPart(details, reward, main_function, aux_function, None)
    code = analysis.combine(aux_function, main_function, analysis.prompt_imports(prompt))
    if analysis.syntax_error(code) is not None:
        return StaticPart(details, reward, main_function, aux_function, None)
    reward += SYNTAX_OK
    details.update(level_2=SYNTAX_OK, syntax_ok=1.0)
    asserts = analysis.extract_asserts(test, entry_point)
    details["total_tests"] = float(len(asserts))
    if not asserts:
        return StaticPart(details, reward, main_function, aux_function, None)
    job = TestJob(code=code, tests=asserts, test_timeout_s=test_timeout_s, max_timeouts=max_timeouts,
                  pre_evaluate=not fixes.fix_assert_pre_evaluation, setup=analysis.prompt_imports(prompt), entry_points=(entry_point,))
    return StaticPart(details, reward, main_function, aux_function, job)


def finish(part: StaticPart, report: Optional[TestReport], fixes: CodeQuirkFixes) -> Dict[str, float]:
    """Add level 3 (from the sandbox report) and level 4 to the static levels."""
    details, reward = dict(part.details), part.reward
    details.update(aux_used=0.0, is_wrapper=0.0, ignored_aux_call=0.0, aux_usage_bonus=0.0, anti_wrapper_bonus=0.0, ignored_call_penalty=0.0)
    if report is not None:
        passed = report.passed
        details.update(passed_tests=float(passed), timeouts=float(report.timeouts))
        test_term = (passed / report.total) * 1.0
        reward += test_term
        details["level_3"] = test_term
        if passed > 0 and part.aux_function:
            reward = _cooperation(part.main_function, reward, details, fixes)
    details["reward"] = reward
    return details


def _cooperation(main: str, reward: float, details: Dict[str, float], fixes: CodeQuirkFixes) -> float:
    if not analysis.calls_aux(main):
        return reward
    details["aux_used"] = 1.0
    reward += AUX_USE
    details["aux_usage_bonus"] = AUX_USE
    wrapper = analysis.ast_is_thin_wrapper(main) if fixes.fix_wrapper_check else analysis.is_thin_wrapper(main)
    details["is_wrapper"] = float(wrapper)
    if not wrapper:
        reward += NON_WRAPPER
        details["anti_wrapper_bonus"] = NON_WRAPPER
    ignored = bool(analysis.ast_ignored_aux_calls(main)) if fixes.fix_ignored_aux_call else analysis.ignored_aux_call(main)
    details["ignored_aux_call"] = float(ignored)
    if ignored:
        reward -= IGNORED_CALL
        details["ignored_call_penalty"] = -IGNORED_CALL
    details["level_4"] = details["aux_usage_bonus"] + details["anti_wrapper_bonus"] + details["ignored_call_penalty"]
    return reward


def code_details(
    joints: Sequence[Tuple[str, str]], rows: Sequence[Mapping[str, Any]], *, sandbox: Sandbox, fixes: CodeQuirkFixes,
    test_timeout_s: float = 10.0, max_timeouts: int = 3,
) -> List[Dict[str, float]]:
    """Reward breakdowns of joint responses ``(c1, c2)``; their tests run in ``sandbox`` in parallel.

    Keys: ``level_1``..``level_4`` (they add up to ``reward``), ``passed_tests``, ``total_tests``,
    ``timeouts``, and the flags and bonus terms behind them.
    """
    for row in rows:
        row_fields(row)  # a malformed row is the configuration's error: it raises, unlike anything a completion holds
    parts = [guarded("code reward", static_part, c1, c2, row, fixes, test_timeout_s, max_timeouts) for (c1, c2), row in zip(joints, rows)]
    pending = [i for i, part in enumerate(parts) if part is not None and part.job is not None]
    reports = dict(zip(pending, sandbox.run_many([parts[i].job for i in pending])))
    out = [None if part is None else guarded("code reward", finish, part, reports.get(i), fixes) for i, part in enumerate(parts)]
    return [details if details is not None else failed_details() for details in out]


def failed_details() -> Dict[str, float]:
    """The breakdown of a joint response whose analysis failed: every term 0 (a failing score)."""
    keys = ("level_1", "level_2", "level_3", "level_4", "passed_tests", "total_tests", "timeouts", "aux_defined", "main_defined",
            "syntax_ok", "aux_used", "is_wrapper", "ignored_aux_call", "aux_usage_bonus", "anti_wrapper_bonus", "ignored_call_penalty",
            "reward")
    return dict.fromkeys(keys, 0.0)


def guarded(label: str, step, *args):
    """``step(*args)``, or None (logged under ``label``) if it raised: one joint response's analysis
    never costs the rest of the batch, whatever its text. Every analysis is bounded (``analysis.py``);
    this is the last line behind it."""
    try:
        return step(*args)
    except Exception as error:  # noqa: BLE001 - scored as failing, the others as usual
        logger.warning("%s: a joint response could not be analysed (%s: %.200s); it scores 0",
                       label, type(error).__name__, error)
        return None
