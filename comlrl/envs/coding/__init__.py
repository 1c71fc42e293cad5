"""Code-generation tasks of OpenMLRL/LLM_Collab_Code_Generation: HumanEval, CoopHumanEval, MBPP.

Two agents solve one Python problem together: agent 1 writes a helper ``aux``, agent 2 the entry
point, which may call ``aux``. Rows have the HumanEval schema (``task_id``, ``prompt`` with the
signature and docstring, ``test`` with ``def check(candidate):`` asserts, ``entry_point``). The
reward (``rewards.py``) grades definitions, syntax, tests (run only in the sandbox) and
cooperation; multi-turn episodes (2 turns by default) get feedback prompts (``feedback.py``;
``expert_edits`` asks an external LLM, ``expert.py``). ``num_agents=1`` is the repository's
single-agent baseline: one agent writes the entry point, scored as a joint response with an empty
aux completion (no aux, so no cooperation level: max 2.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union

from comlrl.envs.base import (
    DetailCache, Environment, EnvironmentSpec, RowIndex, batch_scorer, check_options, normalize_prompt, option, reward_from_details,
)
from comlrl.envs.coding import analysis
from comlrl.envs.coding.expert import ExpertEditor, ExpertSettings, resolve_settings
from comlrl.envs.coding.feedback import MODE_ALIASES, MODES, CodeTransition
from comlrl.envs.coding.rewards import CodeQuirkFixes, code_details, row_fields
from comlrl.envs.coding.sandbox_options import SandboxOptions, check_sandbox_options, sandbox_of
from comlrl.envs.sandbox import Sandbox
from comlrl.envs.sources import DatasetSource, load_rows

__all__ = ["HUMANEVAL", "COOPHUMANEVAL", "MBPP", "CodeOptions"]


@dataclass
class CodeOptions(SandboxOptions):
    """Options of the code environments (``get_environment("humaneval", **options)``)."""

    num_turns: int = option(2, None, "Turns per episode (the run config's trainer section); >1 adds the feedback transition.")
    num_agents: int = option(2, None, "2: aux helper + entry point; 1: the single-agent baseline (entry point only). Set by the trainer section.")
    external_mode: str = option("level_feedback", "external.mode", "Feedback mode: level_feedback, level_passed, passed, plain or expert_edits.")
    sandbox_slice: Union[int, str, None] = option(1, "external.sandbox_slice", "Asserts shown by feedback: N first, -N last, 0/None/'all' every one.")
    original_prompt: bool = option(False, "external.original_prompt", "passed mode: repeat the first-turn instructions.")
    previous_response: bool = option(True, "external.previous_response", "passed mode: show the previous implementation.")
    expert_model: str = option("deepseek-coder", "external.expert_model", "expert_edits: the expert model; names with claude, deepseek or qwen3-coder pick the original's endpoints.")
    expert_api_url: Optional[str] = option(None, "external.expert_api_url", "expert_edits: the endpoint URL (None: the expert model's provider).")
    expert_api_format: Optional[str] = option(None, "external.expert_api_format", "expert_edits: openai, anthropic, openai_responses or generic (None: the provider's, else openai).")
    expert_api_key_env: Optional[str] = option(None, "external.expert_api_key_env", "expert_edits: the variable holding the API key (None: the provider's, e.g. DEEPSEEK_API_KEY; no key for another URL).")
    expert_temperature: Optional[float] = option(None, "external.expert_temperature", "expert_edits: sampling temperature (None: 0.3; not sent to Claude, as in the original).")
    expert_max_tokens: int = option(2048, "external.expert_max_tokens", "expert_edits: the reply's token limit (original: 2048).")
    expert_timeout: float = option(120.0, "external.expert_timeout", "expert_edits: seconds per request.")
    expert_attempts: int = option(3, "external.expert_attempts", "expert_edits: requests per turn before giving up (original: 3).")
    expert_on_failure: str = option("fallback", "external.expert_on_failure", "expert_edits: 'fallback' (original: no edits that turn, with a warning) or 'raise'.")
    expert_include_tests: bool = option(False, "external.expert_include_tests", "expert_edits: also send the feedback asserts and their outcomes (original: none sent).")
    fix_ignored_aux_call: bool = option(False, "reward.fix_ignored_aux_call", "Detect an ignored aux result with an AST check (original: a regex that practically never fires).")
    fix_wrapper_check: bool = option(False, "reward.fix_wrapper_check", "Thin-wrapper check on the AST (original: a line scan confused by docstrings).")
    fix_assert_pre_evaluation: bool = option(False, "reward.fix_assert_pre_evaluation", "Run each assert as written (original: also evaluates a regex split of it first).")
    test_timeout_s: float = option(10.0, "sandbox.test_timeout_s", "Alarm per assert (original: 10 s).")
    max_timeouts: int = option(3, "sandbox.max_timeouts", "Skip a candidate's remaining asserts after this many timeouts (original: 3).")
    wall_time_s: Optional[float] = option(None, "sandbox.wall_time_s", "Wall-clock limit per candidate (None: test_timeout_s x (max_timeouts + 1) + 10).")

    def __post_init__(self) -> None:
        check_options(self, modes=MODES, aliases=MODE_ALIASES, agent_counts=(1, 2), flags=(
            "original_prompt", "previous_response", "fix_ignored_aux_call", "fix_wrapper_check", "fix_assert_pre_evaluation"))
        self.sandbox_slice = _slice_count(self.sandbox_slice)
        check_sandbox_options(self)
        self.expert_settings()

    def expert_settings(self) -> Optional[ExpertSettings]:
        """The checked expert endpoint when ``expert_edits`` is in use (more than one turn), else None."""
        if self.num_turns == 1 or self.external_mode != "expert_edits":
            return None
        return resolve_settings(
            model=self.expert_model, url=self.expert_api_url, api_format=self.expert_api_format, key_env=self.expert_api_key_env,
            temperature=self.expert_temperature, max_tokens=self.expert_max_tokens, timeout=self.expert_timeout,
            attempts=self.expert_attempts, on_failure=self.expert_on_failure, include_tests=self.expert_include_tests,
        )

    def fixes(self) -> CodeQuirkFixes:
        return CodeQuirkFixes(self.fix_ignored_aux_call, self.fix_wrapper_check, self.fix_assert_pre_evaluation)

    def sandbox(self) -> Sandbox:
        return sandbox_of(self, self.test_timeout_s * (self.max_timeouts + 1) + 10.0)


def _slice_count(value: Any) -> Optional[int]:
    """``sandbox_slice`` as the original reads it: an int (0 = all), "all", None, or an int string."""
    if value is None or isinstance(value, bool):
        return None if value is None else 0
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text == "all":
        return 0
    if text.lstrip("-").isdigit():
        return int(text)
    raise ValueError(f"sandbox_slice (external.sandbox_slice) must be an integer, 'all' or null; got {value!r}.")


AUX_PROMPT = (
    "Write a helper function for the coding problem below.\n\nProblem:\n{prompt}\n\n"
    "Rules:\n- Output only the function's code: no explanations, examples or tests\n- No markdown code fences\n"
    "- Name the function aux; the main function will call it\n- aux must return a value that helps solve the problem\n\n"
    "Format:\ndef aux(...):\n    # your code\n    return result\n"
)
MAIN_PROMPT = (
    "Solve the coding problem below by implementing the required function.\n\nProblem:\n{prompt}\n\n"
    "A helper function aux(...) is available to you.\n\n"
    "Rules:\n- Output only the function's code: no explanations, examples or tests\n- No markdown code fences\n"
    "- Do not define aux yourself\n- Implement only the function {entry_point}\n"
    "- You may call aux() and use its result inside your function\n\n"
    "Format:\ndef {entry_point}({params}):\n    # your code\n    return result\n"
)


SINGLE_PROMPT = (
    "Solve the coding problem below by implementing the required function.\n\nProblem:\n{prompt}\n\n"
    "Rules:\n- Output only the function's code: no explanations, examples or tests\n- No markdown code fences\n"
    "- Implement only the function {entry_point}, completely, handling every case\n\n"
    "Format:\ndef {entry_point}({params}):\n    # your code\n    return result\n"
)


def aux_formatter(row: Mapping[str, Any], external_prompts: Optional[str] = None) -> str:
    """Agent 1's prompt: write ``aux`` for the row's problem (later turns: the feedback prompt)."""
    if external_prompts is not None:
        return external_prompts
    prompt, _, _ = row_fields(row)
    return AUX_PROMPT.format(prompt=prompt)


def _entry_prompt(template: str, row: Mapping[str, Any], external_prompts: Optional[str]) -> str:
    if external_prompts is not None:
        return external_prompts
    prompt, _, entry_point = row_fields(row)
    params = ", ".join(analysis.signature_params(prompt, entry_point))
    return template.format(prompt=prompt, entry_point=entry_point, params=params)


def main_formatter(row: Mapping[str, Any], external_prompts: Optional[str] = None) -> str:
    """Agent 2's prompt: write the entry point, which may call ``aux``."""
    return _entry_prompt(MAIN_PROMPT, row, external_prompts)


def single_formatter(row: Mapping[str, Any], external_prompts: Optional[str] = None) -> str:
    """The single agent's prompt: write the entry point, with no helper."""
    return _entry_prompt(SINGLE_PROMPT, row, external_prompts)


def _build(name: str, data: DatasetSource):
    def build(options: CodeOptions) -> Environment:
        settings = options.expert_settings()
        expert = ExpertEditor(settings) if settings is not None else None
        rows = RowIndex(name)
        sandbox = options.sandbox()
        fixes = options.fixes()
        single = options.num_agents == 1

        def score_many(joints: List[tuple], batch_rows: List[Any]) -> List[Dict[str, float]]:
            rows.add(batch_rows)
            pairs = [("", joint[0]) for joint in joints] if single else joints
            return code_details(pairs, batch_rows, sandbox=sandbox, fixes=fixes, test_timeout_s=options.test_timeout_s,
                                max_timeouts=options.max_timeouts)

        def row_key(row: Mapping[str, Any]) -> tuple:
            prompt, test, entry_point = row_fields(row)
            return normalize_prompt(prompt), test, entry_point

        details = batch_scorer(env=name, num_agents=options.num_agents, score_many=score_many, row_key=row_key, cache=DetailCache())
        formatters = [single_formatter] if single else [aux_formatter, main_formatter]
        transition = None
        if options.num_turns > 1:
            transition = CodeTransition(
                mode=options.external_mode, rows=rows, formatters=formatters, sandbox=sandbox, test_slice=options.sandbox_slice,
                original_prompt=options.original_prompt, previous_response=options.previous_response,
                test_timeout_s=options.test_timeout_s, max_timeouts=options.max_timeouts, agents=options.num_agents, expert=expert,
            )

        def loader(*, split: str, offline: Optional[bool], hf_split: Optional[str], source: Optional[str]):
            dataset = load_rows(data, env=name, split=split, offline=offline, hf_split=hf_split, name=source)
            rows.add(dataset)
            return dataset

        reward = reward_from_details(details)
        reward.sandbox_isolation = sandbox.describe()  # what a trainer's run record says of the sandbox
        env = Environment(
            name=name, num_agents=options.num_agents, num_turns=options.num_turns, formatters=formatters,
            reward_func=reward, reward_details=details, external_transition=transition,
            options=options, loader=loader, rows=rows,
        )
        env.sandbox = sandbox
        env.sandbox_isolation = reward.sandbox_isolation
        env.expert = expert
        return env

    return build


FIELDS = ("task_id", "prompt", "test", "entry_point")
HUMANEVAL = EnvironmentSpec(
    name="humaneval", options_cls=CodeOptions,
    build=_build("humaneval", DatasetSource("openai/openai_humaneval", "test[33:163]", "test[:32]", "humaneval.json", FIELDS)),
    description="HumanEval (164 problems): aux helper + entry point, graded by definitions, syntax, tests, cooperation (max 4).",
    agent_counts=(1, 2),
)
COOPHUMANEVAL = EnvironmentSpec(
    name="coophumaneval", options_cls=CodeOptions,
    build=_build("coophumaneval", DatasetSource("OpenMLRL/CoopHumanEval", "train[16:]", "train[:16]", "coophumaneval.json", FIELDS)),
    description="CoopHumanEval (82 decomposable problems), the HumanEval schema and reward.",
    agent_counts=(1, 2),
)
MBPP = EnvironmentSpec(
    name="mbpp", options_cls=CodeOptions,
    build=_build("mbpp", DatasetSource("OpenMLRL/MBPP", "test[15:65]", "test[:15]", "mbpp.json", FIELDS)),
    description="MBPP (sanitized test split in the HumanEval schema), the same reward.",
    agent_counts=(1, 2),
)
