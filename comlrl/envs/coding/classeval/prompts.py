"""ClassEval prompts: each agent's first prompt and the next turns' (``code_feedback``, ``plain``).

First turn (the task repository's ``utils/prompting.py``): the class name, the agent's assigned
methods as a bullet list ("(none)" without any), the rules (only ``def`` blocks of those methods;
no class header, imports, fences or prose; an empty answer without methods) and the sanitized
skeleton between ``SKELETON START`` and ``SKELETON END``.

Later turns (``external/code_feedback.py`` and ``external/plain.py``), for each agent: an
instruction to revise; its own history -- earlier prompts (the first one only with
``original_prompt``) and, with ``previous_response``, its earlier responses cut down to the
snippets of its own methods (responses with none are left out); the skeleton again; in
``code_feedback`` mode the diagnostics of the last joint response (merged as the reward merges it,
tested as the reward tests it: the same report is reused): syntax OK or ERROR, a line when the
tests ran past the wall-clock limit, hidden tests passed x/y (or "not available or not executed"
when none ran), and up to five failing test ids ("+N more"); then a request for the revised
methods in one fenced block. The wording is comlrl's own. Test ids come from the test module
(trusted); the only text of a completion shown is the agent's own earlier responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence

from comlrl.envs.base import DetailCache, RowIndex
from comlrl.envs.coding.classeval import scoring, source
from comlrl.envs.coding.rewards import guarded
from comlrl.envs.sandbox import Sandbox, TestReport
from comlrl.envs.sandbox.cleaning import valid_unicode

MODES = ("code_feedback", "plain")
MODE_ALIASES = {"feedback": "code_feedback", "level_feedback": "code_feedback"}
FAILING_SHOWN = 5

FIRST_PROMPT = (
    "You are one of a team completing the Python class '{class_name}'.\n\n"
    "The whole class skeleton is below. Implement only these methods:\n{assigned}\n\n"
    "Rules for your answer:\n"
    "- Give only the Python function definitions (def blocks) of your methods.\n"
    "- No class header and no imports.\n"
    "- No markdown code fences and no explanations.\n"
    "- Name each function exactly as one of your methods.\n"
    "- If no method is yours, answer with nothing.\n\n"
    "SKELETON START\n{skeleton}\nSKELETON END"
)


def first_prompt(row: Mapping[str, Any], methods: Sequence[str]) -> str:
    skeleton = source.sanitize(str(row.get("skeleton") or ""))
    class_name = row.get("class_name") or source.class_name_of(skeleton) or ""
    assigned = "\n".join(f"- {name}" for name in methods) if methods else "(none)"
    return FIRST_PROMPT.format(class_name=class_name, assigned=assigned, skeleton=skeleton.strip())


def agent_formatter(agent: int, num_agents: int) -> Callable[..., str]:
    """Agent ``agent``'s formatter: its first prompt, or a later turn's prompt passed through."""

    def formatter(row: Mapping[str, Any], external_prompts: Optional[str] = None) -> str:
        if external_prompts is not None:
            return external_prompts
        parts = source.partition(str(row.get("skeleton") or ""), num_agents)
        return first_prompt(row, source.assigned(parts, agent))

    formatter.__name__ = f"classeval_agent_{agent + 1}_formatter"
    return formatter


# ----------------------------------------------------------------------------- later turns


def history_lines(prompts: Sequence[str], responses: Sequence[str], own_methods: Sequence[str], *, original_prompt: bool,
                  previous_response: bool) -> List[str]:
    """An agent's history: its earlier prompts and its earlier responses cut to its own methods."""
    lines: List[str] = []
    shown = [(turn, text) for turn, text in enumerate(prompts, start=1) if turn > 1 or original_prompt]
    if shown:
        lines += ["History: your earlier prompts:", *[f"- Turn {turn} prompt:\n{valid_unicode(text)}" for turn, text in shown], ""]
    if previous_response:
        kept = [(turn, "\n\n".join(source.method_snippets(text, own_methods).values()).strip())
                for turn, text in enumerate(responses, start=1)]
        kept = [(turn, text) for turn, text in kept if text]
        if kept:
            lines += ["History: your earlier responses:", *[f"- Turn {turn} response:\n{valid_unicode(text)}" for turn, text in kept], ""]
    return lines


def diagnostic_lines(merged: Optional[scoring.Merged], report: Optional[TestReport], test_ids: Sequence[str]) -> List[str]:
    """The test summary of the last joint response (see the module docstring); ``merged`` None:
    it could not be analysed."""
    compiles = merged is not None and merged.compiles
    run, passed, _, _ = scoring.test_counts(report)
    lines = ["Diagnostics of the last attempt:", f"- Syntax: {'OK' if compiles else 'ERROR'}"]
    if report is not None and report.termination == "wall_timeout":
        lines.append("- The tests ran past their time limit before they finished.")
    lines.append(f"- Hidden tests passed: {passed}/{run}" if compiles and run else "- Hidden tests not available or not executed.")
    failing = [] if report is None else [
        test_id for test_id, result in zip(test_ids, report.results) if result.status in ("fail", "timeout")]
    if failing:
        more = len(failing) - FAILING_SHOWN
        lines.append("- Failing tests: " + ", ".join(failing[:FAILING_SHOWN]) + (f" (+{more} more)" if more > 0 else ""))
    return lines + [""]


@dataclass
class ClassEvalTransition:
    """The ``external_transition`` of the ClassEval environment (CoMLRL's interface)."""

    mode: str
    rows: RowIndex
    sandbox: Sandbox
    reports: DetailCache
    settings: scoring.TestSettings
    agents: int = 2
    original_prompt: bool = True
    previous_response: bool = True

    def __call__(self, prompt: str, agent_completions: Sequence[str], num_agents: Optional[int] = None,
                 prompt_history_per_agent: Optional[List[List[str]]] = None,
                 response_history_per_agent: Optional[List[List[str]]] = None, **_: Any) -> List[str]:
        n = self.agents
        if num_agents not in (None, n) or len(agent_completions) != n:
            raise ValueError(f"The classeval transition takes the completions of {n} agent(s), got {len(agent_completions)}.")
        row = self.rows.get(prompt)
        task = scoring.task_of(row, n)
        prompts = prompt_history_per_agent or [[] for _ in range(n)]
        responses = response_history_per_agent or [[] for _ in range(n)]
        diagnostics: List[str] = []
        if self.mode == "code_feedback":
            diagnostics = self._diagnostics(task, list(agent_completions))
        skeleton = ["Class skeleton for reference ('" + (task.class_name or "unknown") + "'):", "SKELETON START",
                    task.skeleton.strip(), "SKELETON END", ""]
        out = []
        for agent in range(n):
            lines = ["Read your history" + (" and the diagnostics" if diagnostics else "") + " below and revise your methods; "
                     "keep every method's signature as it is."]
            lines += history_lines(prompts[agent], responses[agent], source.assigned(task.partition, agent),
                                   original_prompt=self.original_prompt, previous_response=self.previous_response)
            lines += skeleton + diagnostics
            lines += ["Answer with only your revised methods, in one ```python ...``` block.",
                      "No explanations, tests or other text outside the block."]
            out.append("\n".join(lines).strip())
        return out

    def _diagnostics(self, task: scoring.ClassTask, texts: List[str]) -> List[str]:
        merged = guarded("classeval feedback", scoring.merge_joint, task, texts)
        job = None if merged is None else scoring.test_job(task, merged, self.settings)
        report = scoring.test_reports(self.sandbox, [job], self.reports)[0]
        return diagnostic_lines(merged, report, task.test_ids)
