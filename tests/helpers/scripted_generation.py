"""A generation backend whose completions a test writes: ``answer(agent, prompt, occurrence)`` gives
the text of the ``occurrence``-th row ever generated for that prompt by that agent (an evaluation's
K copies of an item come in order, so the occurrence modulo K is the sample's number). Tokens are
one id per whitespace-separated word plus an EOS, so completion lengths are known too."""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

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
