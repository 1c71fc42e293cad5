"""Writing tasks of OpenMLRL/LLM_Collab_Writing: TLDR summaries and arXiv introductions.

Two agents, one turn. TLDR: agent 1 writes a concise summary of a Reddit post, agent 2 a detailed
one with a richer vocabulary and transition words (rows: ``prompt``, from ``trl-lib/tldr``). arXiv:
from an abstract, agent 1 writes the background and motivation of an introduction, agent 2 the
methodology and implications (rows: ``abstract_text``, from ``OpenMLRL/arXiv_abstract``). Neither
agent sees the other's text; the shared reward (``rewards.py``) scores how the two fit together.
``num_agents=1`` is the repository's single-agent baseline: one agent writes both parts in one
completion, split at a marker and scored with the same reward (``single.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from comlrl.envs.base import DetailCache, Environment, EnvironmentSpec, batch_scorer, check_options, option, reward_from_details
from comlrl.envs.sources import DatasetSource, load_rows
from comlrl.envs.writing.rewards import ARXIV_REWARD, TLDR_REWARD, WritingQuirkFixes, WritingReward, writing_details
from comlrl.envs.writing.single import SINGLE_PROMPTS, split_paragraphs

__all__ = ["TLDR", "ARXIV", "WritingOptions"]


@dataclass
class WritingOptions:
    """Options of the writing environments (``get_environment("tldr", **options)``)."""

    num_turns: int = option(1, None, "Turns per episode (the run config's trainer section); the writing tasks are single-turn.")
    num_agents: int = option(
        2, None,
        "2: the two writers; 1: the single-agent baseline (both parts in one completion, split at [PARAGRAPH_SPLIT]). "
        "Set by the run config's trainer section.",
    )
    strict_band_edges: bool = option(
        False, "reward.strict_band_edges",
        "A ratio exactly on a band's outer edge stops scoring (original: scores 0 and passes the gate).",
    )
    full_transition_scale: bool = option(
        False, "reward.full_transition_scale",
        "Transition score 0.4 + 0.6 (n-1)/11, reaching 1.0 with all 12 categories (original: at most 0.95).",
    )
    transition_word_boundaries: bool = option(
        False, "reward.transition_word_boundaries",
        "Transition phrases match whole words only (original: substrings, 'so' matches 'also').",
    )
    vocabulary_excludes_stopwords: bool = option(
        False, "reward.vocabulary_excludes_stopwords",
        "Level 3's unique-word ratio ignores stopwords (original: counts them).",
    )

    def __post_init__(self) -> None:
        if self.num_turns != 1:
            raise ValueError(
                f"num_turns={self.num_turns!r}: the writing tasks are single-turn (as in the original, which refuses "
                f"other values); set num_turns=1."
            )
        check_options(self, flags=("strict_band_edges", "full_transition_scale", "transition_word_boundaries", "vocabulary_excludes_stopwords"),
                      agent_counts=(1, 2))

    def fixes(self) -> WritingQuirkFixes:
        return WritingQuirkFixes(
            strict_band_edges=self.strict_band_edges, full_transition_scale=self.full_transition_scale,
            transition_word_boundaries=self.transition_word_boundaries,
            vocabulary_excludes_stopwords=self.vocabulary_excludes_stopwords,
        )


def _field(row: Mapping[str, Any], name: str, env: str) -> str:
    value = row.get(name) if isinstance(row, Mapping) else None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"The {env} formatter needs a non-empty {name!r} field in each row, got {value!r}.")
    return value


def _formatter(env: str, field: str, template: str) -> Callable[..., str]:
    def format_prompt(row: Mapping[str, Any], external_prompts: Optional[str] = None) -> str:
        if external_prompts is not None:
            return external_prompts
        return template.format(text=_field(row, field, env))

    format_prompt.__name__ = f"{env}_formatter"
    return format_prompt


TLDR_PROMPTS = (
    "Write a concise summary of the following post.\n\nPost:\n{text}\n\n"
    "Instructions:\n- Summarize it in one sentence or a few sentences\n- Stay factual and informative\n",
    "Write a detailed summary of the following post.\n\nPost:\n{text}\n\n"
    "Instructions:\n- Use a rich, varied vocabulary\n- Use transition words so that the summary flows\n",
)
ARXIV_PROMPTS = (
    "From the scientific abstract below, write part of the paper's introduction.\n\nAbstract:\n{text}\n\n"
    "Instructions:\n- Another writer covers the methodology and the implications\n"
    "- Write only the background and the motivation\n- Do not repeat methodology or implications\n",
    "From the scientific abstract below, write part of the paper's introduction.\n\nAbstract:\n{text}\n\n"
    "Instructions:\n- Another writer covers the background and the motivation\n"
    "- Write only the methodology and the implications\n- Do not repeat background or motivation\n",
)


def _build(name: str, field: str, prompts: tuple, reward: WritingReward, data: DatasetSource) -> Callable[[WritingOptions], Environment]:
    def build(options: WritingOptions) -> Environment:
        fixes = options.fixes()
        single = options.num_agents == 1

        def score_many(joints: List[tuple], rows: List[Any]) -> List[Dict[str, float]]:
            if not single:
                return [writing_details(c1, c2, reward, fixes) for c1, c2 in joints]
            out = []
            for (text,) in joints:
                first, second, how = split_paragraphs(text)
                out.append({**writing_details(first, second, reward, fixes), "split": how})
            return out

        details = batch_scorer(env=name, num_agents=options.num_agents, score_many=score_many, row_key=lambda row: None,
                               cache=DetailCache())

        def loader(*, split: str, offline: Optional[bool], hf_split: Optional[str], source: Optional[str]):
            return load_rows(data, env=name, split=split, offline=offline, hf_split=hf_split, name=source)

        templates = [SINGLE_PROMPTS[name]] if single else list(prompts)
        return Environment(
            name=name, num_agents=options.num_agents, num_turns=1,
            formatters=[_formatter(name, field, template) for template in templates],
            reward_func=reward_from_details(details), reward_details=details, external_transition=None,
            options=options, loader=loader,
        )

    return build


TLDR = EnvironmentSpec(
    name="tldr",
    options_cls=WritingOptions,
    build=_build("tldr", "prompt", TLDR_PROMPTS, TLDR_REWARD,
                 DatasetSource("trl-lib/tldr", "train[:1100]", "test[:1100]", "tldr.json", ("prompt",))),
    description="Reddit post -> a concise and a detailed summary (2 agents, 1 turn, max reward 3).",
    agent_counts=(1, 2),
)
ARXIV = EnvironmentSpec(
    name="arxiv",
    options_cls=WritingOptions,
    build=_build("arxiv", "abstract_text", ARXIV_PROMPTS, ARXIV_REWARD,
                 DatasetSource("OpenMLRL/arXiv_abstract", "train[:1100]", "val[:1100]", "arxiv.json", ("abstract_text",))),
    description="arXiv abstract -> background/motivation and methodology/implications (2 agents, 1 turn, max 3).",
    agent_counts=(1, 2),
)
