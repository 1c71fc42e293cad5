"""Multi-turn feedback of the code tasks: the next turn's prompt for the aux and the main agent.

Modes (``external.mode``), as in OpenMLRL/LLM_Collab_Code_Generation:

- ``level_feedback`` (default): each agent's own prompt and response history, then diagnostics of
  the previous joint response: aux and main definitions found or missing, syntax (with line and
  column), tests passed x/y with every failing assert and its error; the main agent also hears
  whether it calls aux and uses the result, and whether it is a thin wrapper.
- ``level_passed``: the first-turn instructions, the previous implementation and short signals
  (implementation found, syntax correct, tests passed, aux usage).
- ``passed``: the previous implementation and one signal: all levels passed or not.
- ``plain``: the history and an instruction to revise.
- ``expert_edits``: each agent's history, then edit suggestions for its part from an external LLM
  (``expert.py``, through ``comlrl.adapters.CompletionClient``).

With one agent (the single-agent baseline, ``num_agents=1``) every mode speaks only of the entry
point: no aux definition, no aux usage.

Feedback tests are the first ``sandbox_slice`` asserts (1 by default; 0 or "all": every assert;
negative: the last ones), run in the sandbox with ``math`` in the globals, as the original.

Whatever the completions hold, the transition returns prompts: the analysis is bounded
(``analysis.py``), a job that fails is a report without passes, and a diagnosis that raises anyway
is reported as "could not be analysed". Every piece of text the diagnosis produces (error types
and messages, asserts, syntax errors, aux-usage notes) enters the prompt cleaned by Unicode
category and capped (``comlrl.envs.sandbox.cleaning``); an agent's own earlier prompts and
responses are shown as they were (lone surrogates aside). A job without any candidate code (no aux
and no entry point found) depends on the row alone: its report is computed once per row.
Differences: the wording of the prompts is comlrl's own; an aux result assigned and used later is
reported as used (the original's AST walk reported it as "never used", docs/differences.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from comlrl.envs.base import DetailCache, RowIndex
from comlrl.envs.coding import analysis
from comlrl.envs.coding.expert import ExpertEditor, expert_prompts, request_text
from comlrl.envs.coding.rewards import row_fields
from comlrl.envs.sandbox import Sandbox, TestJob, TestReport
from comlrl.envs.sandbox.cleaning import clean_text, valid_unicode
from comlrl.envs.sandbox.jobs import MESSAGE_CAP, NAME_CAP

MODES = ("level_feedback", "level_passed", "passed", "plain", "expert_edits")
MODE_ALIASES = {"feedback": "level_feedback", "signals": "level_passed", "expert": "expert_edits", "edits": "expert_edits"}
ASSERT_CAP = 2000
"""Characters of an assert shown in a prompt."""
logger = logging.getLogger(__name__)


@dataclass
class CodeDiagnostics:
    """Static and test analysis of one joint response, for feedback."""

    aux_function: str
    main_function: str
    aux_defined: bool
    aux_message: str
    main_defined: bool
    main_message: str
    syntax_error: Optional[Tuple[Optional[int], Optional[int], str]]
    aux_called: bool
    aux_misuse: List[str]
    is_wrapper: bool
    tests_passed: int = 0
    tests_total: int = 0
    failures: List[Tuple[str, str, str]] = field(default_factory=list)  # (assert, error type, message)
    skipped: List[str] = field(default_factory=list)  # asserts not run (after the timeouts, or the candidate gone)
    cases: List[str] = field(default_factory=list)  # the feedback asserts (run only when the code parses)

    @property
    def syntax_ok(self) -> bool:
        return self.syntax_error is None

    def outcomes(self) -> List[Tuple[str, str]]:
        """(assert, "passed" / "failed: <error>" / "not run: ...") of every feedback assert."""
        if not self.syntax_ok:
            return [(case, "not run: the code does not parse") for case in self.cases]
        failed = {case: f"failed: {kind}" + (f": {message}" if message else "") for case, kind, message in self.failures}
        failed.update((case, "not run") for case in self.skipped)
        return [(case, failed.get(case, "passed")) for case in self.cases]


def diagnose(row: Mapping[str, Any], aux_text: str, main_text: str, *, sandbox: Sandbox, test_slice: Optional[int],
             test_timeout_s: float, max_timeouts: int, code_free: Optional[DetailCache] = None) -> CodeDiagnostics:
    """The diagnostics of one joint response; ``code_free`` keeps the reports of jobs without candidate code."""
    prompt, test, entry_point = row_fields(row)
    aux_function = analysis.extract_function(aux_text, analysis.AUX)
    main_function = analysis.extract_function(main_text, entry_point)
    aux_ok, aux_message = analysis.defines_with_return(aux_text, analysis.AUX, "Aux function")
    main_ok, main_message = analysis.defines_with_return(main_text, entry_point, f"Main function ({entry_point})")
    code = analysis.combine(aux_function, main_function, analysis.prompt_imports(prompt))
    report = CodeDiagnostics(
        aux_function, main_function, aux_ok, aux_message, main_ok, main_message, analysis.syntax_error(code),
        analysis.calls_aux(main_function), analysis.ast_ignored_aux_calls(main_function) if main_function else [],
        analysis.is_thin_wrapper(main_function),
    )
    asserts = analysis.extract_asserts(analysis.sliced_test_code(test, test_slice), entry_point)
    report.cases = list(asserts)
    if report.syntax_ok and asserts:
        job = TestJob(code=code, tests=asserts, seed_math=True, test_timeout_s=test_timeout_s, max_timeouts=max_timeouts,
                      setup=analysis.prompt_imports(prompt), entry_points=(entry_point,))
        result = None
        if code_free is not None and not (aux_function or main_function):  # no candidate code: the row's own outcome
            key = (job.code, tuple(job.tests), job.setup, job.entry_points, job.test_timeout_s, job.max_timeouts)
            result = code_free.get(key)
            if result is None:
                result = sandbox.run(job)
                code_free.put(key, result)
        result = result or sandbox.run(job)
        _add_outcomes(report, asserts, result)
    return report


def _add_outcomes(report: CodeDiagnostics, asserts: Sequence[str], result: TestReport) -> None:
    report.tests_total, report.tests_passed = len(asserts), result.passed
    for case, outcome in zip(asserts, result.results):
        if not result.loaded:
            kind, _, message = (result.load_error or "Error: the code did not run").partition(": ")
            report.failures.append((case, kind, message))
        elif outcome.status == "timeout":
            report.failures.append((case, "TimeoutException", outcome.error_message or "test execution timed out"))
        elif outcome.status == "fail":
            report.failures.append((case, outcome.error_type or "Error", outcome.error_message or ""))
        elif outcome.status == "not run":
            report.skipped.append(case)


def unanalysable(entry_point: str) -> CodeDiagnostics:
    """The diagnostics shown when a joint response could not be analysed at all."""
    why = "could not be analysed"
    return CodeDiagnostics("", "", False, f"Aux function {why}", False, f"Main function ({entry_point}) {why}",
                           (None, None, f"the code {why}"), False, [], False)


# ----------------------------------------------------------------------------- prompt pieces


def _history(prompts: Sequence[str], responses: Sequence[str], role: str) -> List[str]:
    """An agent's own earlier prompts and responses, as they were (lone surrogates replaced)."""
    lines: List[str] = []
    if prompts:
        lines.append("Your earlier prompts:")
        lines += [f"- Turn {t} prompt:\n{valid_unicode(text)}" for t, text in enumerate(prompts, start=1)]
        lines.append("")
    if responses:
        lines.append(f"Your earlier {role} responses:")
        lines += [f"- Turn {t} response:\n{valid_unicode(text)}" for t, text in enumerate(responses, start=1)]
        lines.append("")
    return lines


def _test_lines(d: CodeDiagnostics) -> List[str]:
    if d.tests_total == 0:
        return ["- Tests: no test cases found"]
    lines = [f"- Tests: {d.tests_passed}/{d.tests_total} passed"]
    lines += [f"  Failed: {clean_text(case, ASSERT_CAP)} -> {clean_text(kind, NAME_CAP)}: {clean_text(message, MESSAGE_CAP)}"
              for case, kind, message in d.failures]
    return lines


def _definition(found: bool, name: str, message: str) -> str:
    return f"- {name} definition: {'FOUND' if found else 'MISSING'} ({clean_text(message, MESSAGE_CAP)})"


def _syntax_lines(d: CodeDiagnostics) -> List[str]:
    if d.syntax_ok:
        return ["- Syntax: OK"]
    line, column, message = d.syntax_error
    return [f"- Syntax: ERROR at line {line}, column {column}: {clean_text(message, MESSAGE_CAP)}"]


def _aux_use(d: CodeDiagnostics) -> str:
    if not d.main_defined:
        return "main is missing, so aux usage cannot be checked"
    if not d.aux_called:
        return "main does not call aux"
    if d.aux_misuse:
        return "main calls aux but does not use the result (" + clean_text(", ".join(d.aux_misuse[:2]), MESSAGE_CAP) + ")"
    return "main calls aux and uses its result"


def _diagnostic_lines(d: CodeDiagnostics, agents: int, own: str) -> List[str]:
    """Definitions (the reader's own first), syntax and tests; one agent hears nothing of aux."""
    main = _definition(d.main_defined, "Main", d.main_message)
    aux = _definition(d.aux_defined, "Aux", d.aux_message)
    definitions = [main] if agents == 1 else ([aux, main] if own == "aux" else [main, aux])
    return ["Diagnostics of the last attempt:", *definitions, *_syntax_lines(d), *_test_lines(d)]


def level_feedback_prompts(d: CodeDiagnostics, entry_point: str, prompt_history, response_history, agents: int = 2) -> List[str]:
    main = _history(prompt_history[-1], response_history[-1], "main" if agents == 2 else entry_point + "(...)")
    main += _diagnostic_lines(d, agents, "main")
    if agents == 2 and d.main_defined:
        main.append(f"- Aux usage: {_aux_use(d)}")
        if d.is_wrapper:
            main.append("- Warning: main looks like a thin wrapper around aux")
    main.append(f"\nRevise your {entry_point}(...) accordingly. Output only the function code, nothing else.")
    if agents == 1:
        return ["\n".join(main)]
    aux = _history(prompt_history[0], response_history[0], "aux(...)") + _diagnostic_lines(d, agents, "aux")
    aux.append("\nRevise your aux(...) accordingly. Output only the function code, nothing else.")
    return ["\n".join(aux), "\n".join(main)]


def _test_signal(d: CodeDiagnostics) -> str:
    if d.tests_total == 0:
        return "no tests found"
    if d.tests_passed == d.tests_total:
        return "all tests passed"
    if d.tests_passed == 0:
        return "no test passed"
    return f"{d.tests_passed}/{d.tests_total} tests passed"


def _roles(d: CodeDiagnostics, entry_point: str, agents: int) -> List[Tuple[str, str, bool]]:
    """(function name, previous implementation, found) of each agent's part."""
    main = (entry_point, d.main_function, d.main_defined)
    return [main] if agents == 1 else [("aux", d.aux_function, d.aux_defined), main]


def level_passed_prompts(d: CodeDiagnostics, entry_point: str, first_prompts: Sequence[str], agents: int = 2) -> List[str]:
    syntax = "correct" if d.syntax_ok else "not correct"
    out = []
    for index, (name, function, found) in enumerate(_roles(d, entry_point, agents)):
        lines = [first_prompts[index], "", f"Your previous {name}(...):", valid_unicode(function) or "<no implementation found>", "",
                 "Signals:", f"- Implementation: {'found' if found else 'not found in the required form'}",
                 f"- Syntax: {syntax}", f"- Tests: {_test_signal(d)}"]
        if agents == 2 and name == entry_point:
            lines.append(f"- Aux usage: {_aux_use(d)}")
        lines += ["", f"Revise your {name}(...) accordingly. Output only the function code."]
        out.append("\n".join(lines))
    return out


def passed_prompts(d: CodeDiagnostics, entry_point: str, first_prompts: Sequence[str], *, original_prompt: bool, previous_response: bool,
                   agents: int = 2) -> List[str]:
    passed = d.syntax_ok and d.main_defined and d.tests_total > 0 and d.tests_passed == d.tests_total
    signal = "every level passed" if passed else "not every level passed"
    out = []
    for index, (name, function, _) in enumerate(_roles(d, entry_point, agents)):
        lines = [first_prompts[index], ""] if original_prompt else []
        if previous_response:
            lines += [f"Your previous {name}(...):", valid_unicode(function) or "<no implementation found>", ""]
        lines += [f"Signal: {signal}", "", f"Revise your {name}(...) if needed. Output only the function code."]
        out.append("\n".join(lines))
    return out


def plain_prompts(entry_point: str, prompt_history, response_history, agents: int = 2) -> List[str]:
    main = _history(prompt_history[-1], response_history[-1], "main" if agents == 2 else entry_point + "(...)")
    main.append(f"Revise your {entry_point}(...). Output only the function code.")
    if agents == 1:
        return ["\n".join(main)]
    aux = _history(prompt_history[0], response_history[0], "aux(...)") + ["Revise your aux(...). Output only the function code."]
    return ["\n".join(aux), "\n".join(main)]


@dataclass
class CodeTransition:
    """The ``external_transition`` of a code environment (CoMLRL's interface), for ``agents`` 2 (aux,
    main) or 1 (main only); ``expert`` asks the external LLM in ``expert_edits`` mode."""

    mode: str
    rows: RowIndex
    formatters: Sequence[Callable[..., str]]
    sandbox: Sandbox
    test_slice: Optional[int] = 1
    original_prompt: bool = False
    previous_response: bool = True
    test_timeout_s: float = 10.0
    max_timeouts: int = 3
    agents: int = 2
    expert: Optional[ExpertEditor] = None
    code_free: DetailCache = field(default_factory=DetailCache)
    """Reports of the jobs without candidate code, by job (see ``diagnose``)."""

    def __call__(self, prompt: str, agent_completions: Sequence[str], num_agents: Optional[int] = None,
                 prompt_history_per_agent: Optional[List[List[str]]] = None,
                 response_history_per_agent: Optional[List[List[str]]] = None, **_: Any) -> List[str]:
        n = self.agents
        if num_agents not in (None, n) or len(agent_completions) != n:
            raise ValueError(f"This code transition takes the completions of {n} agent(s), got {len(agent_completions)}.")
        row = self.rows.get(prompt)
        entry_point = row_fields(row)[2]
        prompts = prompt_history_per_agent or [[] for _ in range(n)]
        responses = response_history_per_agent or [[] for _ in range(n)]
        if self.mode == "plain":
            return plain_prompts(entry_point, prompts, responses, n)
        aux_text, main_text = ("", agent_completions[0]) if n == 1 else tuple(agent_completions)
        if self.mode == "expert_edits":
            return self._expert(row, aux_text, main_text, entry_point, prompts, responses)
        d = self._diagnose(row, aux_text, main_text)
        if self.mode == "level_feedback":
            return level_feedback_prompts(d, entry_point, prompts, responses, n)
        first = [formatter(row) for formatter in self.formatters]
        if self.mode == "level_passed":
            return level_passed_prompts(d, entry_point, first, n)
        return passed_prompts(d, entry_point, first, original_prompt=self.original_prompt, previous_response=self.previous_response,
                              agents=n)

    def _diagnose(self, row: Mapping[str, Any], aux_text: str, main_text: str) -> CodeDiagnostics:
        """``diagnose``; if it raises anyway (every analysis is bounded: this is the last line behind
        it), diagnostics that say the code could not be analysed."""
        try:
            return diagnose(row, aux_text, main_text, sandbox=self.sandbox, test_slice=self.test_slice,
                            test_timeout_s=self.test_timeout_s, max_timeouts=self.max_timeouts, code_free=self.code_free)
        except Exception as error:  # noqa: BLE001 - this item gets its feedback, the batch goes on
            logger.warning("code feedback: a joint response could not be analysed (%s: %.200s)", type(error).__name__, error)
            return unanalysable(row_fields(row)[2])

    def _expert(self, row: Mapping[str, Any], aux_text: str, main_text: str, entry_point: str, prompts, responses) -> List[str]:
        if self.expert is None:
            raise ValueError("external.mode=expert_edits needs an expert endpoint (build the environment with get_environment).")
        tests = self._diagnose(row, aux_text, main_text).outcomes() if self.expert.settings.include_tests else None
        text = request_text(row_fields(row)[0], aux_text, main_text, agents=self.agents, entry_point=entry_point, tests=tests)
        return expert_prompts(self.expert.edits(text), entry_point, prompts, responses, _history, self.agents)
