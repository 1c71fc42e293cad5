"""A generation backend whose completions a test writes: ``answer(agent, prompt, occurrence)`` gives
the text of the ``occurrence``-th row ever generated for that prompt by that agent (an evaluation's
K copies of an item come in order, so the occurrence modulo K is the sample's number). Tokens are
one id per whitespace-separated word plus an EOS, so completion lengths are known too.

``answer`` is the script of the pass@k tests on HumanEval's bundled eval split (rotate_left,
second_largest), two turns, K = 4 samples per item: aux is always the same helper; which samples'
entry point passes every test is ``CORRECT[(entry point, turn)]``."""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import shutil

import pytest
import torch

from comlrl.rollout.generation import Completions, SamplingParams


class ScriptedGenerator:
    def __init__(self, agent: int, answer: Callable[[int, str, int], str]):
        self.agent = agent
        self.answer = answer
        self.seen: Dict[str, int] = {}
        self.calls = []  # (number of prompts, K, do_sample, seeds given)

    def generate(self, prompts: Sequence[str], num_samples: int, sampling: SamplingParams, seeds: Optional[Sequence[int]] = None) -> Completions:
        self.calls.append((len(prompts), num_samples, sampling.do_sample, seeds is not None))
        texts = []
        for prompt in prompts:
            for _ in range(num_samples):
                occurrence = self.seen.get(prompt, 0)
                self.seen[prompt] = occurrence + 1
                texts.append(self.answer(self.agent, prompt, occurrence))
        tokens = [torch.arange(len(text.split()) + 1) for text in texts]
        return Completions(prompt_ids=[torch.zeros(1, dtype=torch.long) for _ in prompts], tokens=tokens, texts=texts,
                           num_samples=num_samples)


def script_team(trainer, answer: Callable[[int, str, int], str]) -> Tuple[ScriptedGenerator, ...]:
    """Give every agent of ``trainer`` a scripted backend; return them."""
    generators = tuple(ScriptedGenerator(agent, answer) for agent in range(trainer.num_agents))
    for policy, generator in zip(trainer.team.policies, generators):
        policy.generator = generator
    return generators


# ----------------------------------------------------------------------------- the HumanEval script

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

AUX = "def aux(x):\n    return x\n"
SOLUTIONS = {  # entry point -> (passes every test, fails some)
    "rotate_left": ("def rotate_left(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[k:] + items[:k]\n",
                    "def rotate_left(items, k):\n    return items\n"),
    "second_largest": ("def second_largest(values):\n    d = sorted(set(values))\n    return d[-2] if len(d) >= 2 else None\n",
                       "def second_largest(values):\n    return None\n"),
}
K = 4
# (entry point, turn) -> the samples whose answer passes every test
CORRECT = {("rotate_left", 1): {0, 1}, ("rotate_left", 2): {0, 1, 2, 3}, ("second_largest", 1): set(), ("second_largest", 2): {0}}


def answer(agent, prompt, occurrence):
    if agent == 0:
        return AUX
    entry = next(name for name in SOLUTIONS if name in prompt)
    turn = 2 if "Revise your" in prompt else 1
    right, wrong = SOLUTIONS[entry]
    return right if occurrence % K in CORRECT[(entry, turn)] else wrong


def main_agent(prompt: str) -> int:
    """Which agent a code prompt is for: the entry point's writer (1) or aux's (0)."""
    if prompt.startswith("Solve the coding problem") or any(f"Revise your {name}" in prompt for name in SOLUTIONS):
        return 1
    return 0
