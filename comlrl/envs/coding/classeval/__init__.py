"""ClassEval class-level code completion, as OpenMLRL/LLM_Collab_Code_Completion trains it.

The agents complete one Python class together: the skeleton's incomplete methods are split between
them by signature (one parameter, ``self``: agent 1; more: agent 2), each writes the ``def`` blocks
of its own methods, and the snippets are merged into the skeleton (``source.py``). The reward
(``scoring.py``, max 6) grades the methods kept (2), the class's unittest tests (4, run in the
sandbox: the class in the contained candidate process, the tests in the checker) and the overlap
of the agents' work (down to -1); a class that does not compile scores 0. Two turns by default,
the second with ``code_feedback`` (syntax, tests passed, failing tests) or ``plain`` prompts
(``prompts.py``). Rows have ClassEval's schema (``task_id``, ``skeleton``, ``test``,
``class_name``, ...); each row's ``prompt`` is its skeleton (the key transitions find it by).
``num_agents=1`` gives one agent every method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from comlrl.envs.base import (
    DetailCache, Environment, EnvironmentSpec, RowIndex, batch_scorer, check_options, normalize_prompt, option, reward_from_details,
)
from comlrl.envs.coding.classeval import prompts, scoring
from comlrl.envs.coding.sandbox_options import SandboxOptions, check_sandbox_options, sandbox_of
from comlrl.envs.sandbox import Sandbox
from comlrl.envs.sources import DatasetSource, load_rows

__all__ = ["CLASSEVAL", "ClassEvalOptions"]

FIELDS = ("task_id", "skeleton", "test", "class_name")
DATA = DatasetSource("FudanSELab/ClassEval", "test[:66]", "test[66:82]", "classeval.json", FIELDS)


@dataclass
class ClassEvalOptions(SandboxOptions):
    """Options of the ClassEval environment (``get_environment("classeval", **options)``)."""

    num_turns: int = option(2, None, "Turns per episode (the run config's trainer section); >1 adds the feedback transition.")
    num_agents: int = option(2, None, "2: methods split by signature; 1: one agent writes every method. Set by the trainer section.")
    external_mode: str = option("code_feedback", "external.mode", "Feedback mode: code_feedback (history, skeleton, tests passed, failing tests) or plain (history and skeleton).")
    original_prompt: bool = option(True, "external.original_prompt", "Show the first-turn prompt in the history of later turns.")
    previous_response: bool = option(True, "external.previous_response", "Show the agent's earlier responses (its own methods only) in later turns.")
    test_timeout_s: float = option(40.0, "sandbox.test_timeout_s", "Alarm per unittest test (original: 40 s).")
    max_timeouts: int = option(3, "sandbox.max_timeouts", "Skip a class's remaining tests after this many timeouts (original: 3).")
    wall_time_s: Optional[float] = option(None, "sandbox.wall_time_s", "Wall-clock limit per class (None: test_timeout_s x max_timeouts + 5, the original's 125 s).")

    def __post_init__(self) -> None:
        check_options(self, modes=prompts.MODES, aliases=prompts.MODE_ALIASES, agent_counts=(1, 2),
                      flags=("original_prompt", "previous_response"))
        check_sandbox_options(self)

    def settings(self) -> scoring.TestSettings:
        return scoring.TestSettings(float(self.test_timeout_s), self.max_timeouts)

    def sandbox(self) -> Sandbox:
        return sandbox_of(self, self.test_timeout_s * self.max_timeouts + 5.0)  # the original's outer timeout


def with_prompt(row: Mapping[str, Any]) -> Dict[str, Any]:
    """The row with a ``prompt``: its skeleton, unless it has one (how a transition finds its row)."""
    out = dict(row)
    if not out.get("prompt"):
        out["prompt"] = str(out.get("skeleton") or "")
    return out


def build(options: ClassEvalOptions) -> Environment:
    rows = RowIndex("classeval")
    sandbox = options.sandbox()
    settings = options.settings()
    reports = DetailCache(size=64)  # test reports by merged class, shared by the reward and the feedback

    def score_many(joints: List[tuple], batch_rows: List[Any]) -> List[Dict[str, float]]:
        rows.add([with_prompt(row) for row in batch_rows if isinstance(row, Mapping)])
        return scoring.classeval_details(joints, batch_rows, sandbox=sandbox, num_agents=options.num_agents, settings=settings,
                                         reports=reports)

    def row_key(row: Mapping[str, Any]) -> tuple:
        return normalize_prompt(row.get("skeleton")), str(row.get("test"))

    details = batch_scorer(env="classeval", num_agents=options.num_agents, score_many=score_many, row_key=row_key, cache=DetailCache())
    transition = None
    if options.num_turns > 1:
        transition = prompts.ClassEvalTransition(
            mode=options.external_mode, rows=rows, sandbox=sandbox, reports=reports, settings=settings, agents=options.num_agents,
            original_prompt=options.original_prompt, previous_response=options.previous_response,
        )

    def loader(*, split: str, offline: Optional[bool], hf_split: Optional[str], source: Optional[str]):
        dataset = load_rows(DATA, env="classeval", split=split, offline=offline, hf_split=hf_split, name=source, prepare=with_prompt)
        rows.add(dataset)
        return dataset

    reward = reward_from_details(details)
    reward.sandbox_isolation = sandbox.describe()  # what a trainer's run record says of the sandbox
    env = Environment(
        name="classeval", num_agents=options.num_agents, num_turns=options.num_turns,
        formatters=[prompts.agent_formatter(agent, options.num_agents) for agent in range(options.num_agents)],
        reward_func=reward, reward_details=details, external_transition=transition, options=options, loader=loader, rows=rows,
    )
    env.sandbox = sandbox
    env.sandbox_isolation = reward.sandbox_isolation
    return env


CLASSEVAL = EnvironmentSpec(
    name="classeval", options_cls=ClassEvalOptions, build=build,
    description="ClassEval (100 classes): the agents complete a class's methods, graded by methods kept, unittest tests and overlap (max 6).",
    agent_counts=(1, 2),
)
