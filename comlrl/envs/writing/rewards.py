"""The writing rewards: four gated levels over the two agents' texts (max 3.0).

For one joint response (agent 1's text ``c1``, agent 2's text ``c2``), with ``tokens(t)`` the
whitespace-separated token count, ``chars(t)`` the character count and ``words(t)`` the set of
lowercased ``\\b\\w+\\b`` words:

    level 1  structure     0.5  if both token counts lie in [lo, hi]            else stop
    level 2  coordination  band(chars(c2) / chars(c1))  on a ramp-plateau-ramp    else stop
    level 3  vocabulary    band(|words(c2)| / |words(c1)|)                       else stop
    level 4  style         0.4 * T + 0.6 * min(J, cap) / cap

``band`` is 0 at the outer edge ``low``, rises linearly to the level's value at ``full_low``, stays
there up to ``full_high`` and falls linearly to 0 at ``high``; a ratio outside ``[low, high]`` fails
the level and stops scoring. ``T`` (transitions) is 0 when no transition category occurs in the
style text, else ``min(0.4 + min(0.05 * (n - 1), 0.6), 1.0)`` for ``n`` categories; ``J`` is the
Jaccard overlap of the two texts' word sets without stopwords (1.0 when both are empty). The
reward is the sum of the levels reached. TLDR and arXiv differ only in their numbers
(``TLDR_REWARD``, ``ARXIV_REWARD``), taken value for value from OpenMLRL/LLM_Collab_Writing.

Quirks of the original kept by default, each with an opt-in correction (``WritingQuirkFixes``):
- a ratio exactly on a band's outer edge scores 0 for that level yet passes the gate
  (``strict_band_edges``: such a ratio stops scoring, as its neighbours outside the band do);
- with 12 categories ``T`` peaks at 0.95, so level 4 (and the reward) never reaches its maximum
  (``full_transition_scale``: ``T = 0.4 + 0.6 (n - 1) / 11``, 1.0 for all 12);
- transition phrases match inside words ("so" in "also", "as" in "has")
  (``transition_word_boundaries``: whole words only);
- level 3 counts stopwords although the original's documentation says it excludes them
  (``vocabulary_excludes_stopwords``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, Optional, Set

from comlrl.envs.writing.vocabulary import STOPWORDS, TRANSITIONS

WORD = re.compile(r"\b\w+\b")


@dataclass(frozen=True)
class Band:
    """Ramp-plateau-ramp score of a ratio (see the module docstring); ``math.inf`` for no upper side."""

    low: float
    full_low: float
    full_high: float
    high: float
    value: float


@dataclass(frozen=True)
class WritingReward:
    """The numbers of one writing task's reward."""

    token_range: tuple
    """Inclusive whitespace-token range each text must fall in (level 1, worth 0.5)."""
    length_band: Band
    """Level 2 on ``chars(c2) / chars(c1)``."""
    vocabulary_band: Band
    """Level 3 on ``|words(c2)| / |words(c1)|``."""
    transitions_in_both: bool
    """Level 4's transition categories are looked for in ``c1 + c2`` (arXiv) or ``c2`` only (TLDR)."""
    jaccard_cap: float
    """Jaccard overlap at and above which level 4's overlap part is full."""


TLDR_REWARD = WritingReward(
    token_range=(8, 256),
    length_band=Band(1.1, 1.6, 3.2, 5.0, 1.0),
    vocabulary_band=Band(1.3, 2.0, math.inf, math.inf, 0.5),
    transitions_in_both=False,
    jaccard_cap=0.03,
)
ARXIV_REWARD = WritingReward(
    token_range=(128, 256),
    length_band=Band(0.8, 1.3, 1.6, 2.0, 1.0),
    vocabulary_band=Band(0.5, 0.7, 1.3, 1.7, 0.5),
    transitions_in_both=True,
    jaccard_cap=0.23,
)


@dataclass(frozen=True)
class WritingQuirkFixes:
    """Opt-in corrections of the original reward's quirks (all off: the original values)."""

    strict_band_edges: bool = False
    full_transition_scale: bool = False
    transition_word_boundaries: bool = False
    vocabulary_excludes_stopwords: bool = False


# ----------------------------------------------------------------------------- text statistics


def token_count(text: str) -> int:
    return len(text.split())


def word_set(text: str, *, drop_stopwords: bool) -> Set[str]:
    words = set(WORD.findall(text.lower()))
    return words - STOPWORDS if drop_stopwords else words


def jaccard(a: Set[str], b: Set[str]) -> float:
    """``|a & b| / |a | b|``; 1.0 when both sets are empty."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def transition_categories(text: str, *, word_boundaries: bool = False) -> int:
    """How many of the 12 categories have a phrase in ``text`` (lowercased)."""
    lowered = text.lower()
    found = 0
    for phrases in TRANSITIONS.values():
        if word_boundaries:
            hit = any(re.search(rf"\b{re.escape(p)}\b", lowered) for p in phrases)
        else:
            hit = any(p in lowered for p in phrases)
        found += hit
    return found


def transition_score(categories: int, *, full_scale: bool = False) -> float:
    """T of level 4: 0 without a category; original ``min(0.4 + min(0.05 (n-1), 0.6), 1)``;
    ``full_scale``: ``0.4 + 0.6 (n-1) / (C-1)`` with C = 12 categories."""
    if categories <= 0:
        return 0.0
    if full_scale:
        return 0.4 + 0.6 * (categories - 1) / (len(TRANSITIONS) - 1)
    return min(0.4 + min((categories - 1) * 0.05, 0.6), 1.0)


def band_term(ratio: float, band: Band) -> Optional[float]:
    """The level's score at ``ratio``, or None outside ``[low, high]`` (the gate stops)."""
    if band.full_low <= ratio <= band.full_high:
        return band.value
    if band.low <= ratio < band.full_low:
        return band.value * ((ratio - band.low) / (band.full_low - band.low))
    if band.full_high < ratio <= band.high:
        return band.value * (1.0 - (ratio - band.full_high) / (band.high - band.full_high))
    return None


# ----------------------------------------------------------------------------- the reward


def writing_details(c1: str, c2: str, spec: WritingReward, fixes: WritingQuirkFixes = WritingQuirkFixes()) -> Dict[str, float]:
    """The reward of one joint response with its level terms (``level_1``..``level_4``, summing to
    ``reward``; levels not reached are 0) and statistics (``tokens_1``, ``tokens_2``,
    ``length_ratio``, ``unique_words_ratio``, ``transition_categories``, ``jaccard``,
    ``levels_passed``)."""
    out = {"level_1": 0.0, "level_2": 0.0, "level_3": 0.0, "level_4": 0.0, "levels_passed": 0.0}
    tokens_1, tokens_2 = token_count(c1), token_count(c2)
    out.update(tokens_1=float(tokens_1), tokens_2=float(tokens_2))
    lo, hi = spec.token_range
    if not (lo <= tokens_1 <= hi and lo <= tokens_2 <= hi):
        return _finish(out)
    out["level_1"], out["levels_passed"] = 0.5, 1.0

    if len(c1) == 0 or not _band_level(out, 2, "length_ratio", len(c2) / len(c1), spec.length_band, fixes):
        return _finish(out)
    vocab_1 = word_set(c1, drop_stopwords=fixes.vocabulary_excludes_stopwords)
    vocab_2 = word_set(c2, drop_stopwords=fixes.vocabulary_excludes_stopwords)
    if not vocab_1 or not _band_level(out, 3, "unique_words_ratio", len(vocab_2) / len(vocab_1), spec.vocabulary_band, fixes):
        return _finish(out)

    style_text = c1 + c2 if spec.transitions_in_both else c2
    categories = transition_categories(style_text, word_boundaries=fixes.transition_word_boundaries)
    overlap = jaccard(word_set(c1, drop_stopwords=True), word_set(c2, drop_stopwords=True))
    out.update(transition_categories=float(categories), jaccard=overlap)
    t = transition_score(categories, full_scale=fixes.full_transition_scale)
    out["level_4"] = 0.4 * t + 0.6 * (min(overlap, spec.jaccard_cap) / spec.jaccard_cap)
    out["levels_passed"] = 4.0
    return _finish(out)


def _band_level(out: Dict[str, float], level: int, ratio_key: str, ratio: float, band: Band, fixes: WritingQuirkFixes) -> bool:
    """Record ``ratio`` and the level's term; False when the gate stops (outside the band, or on its
    outer edge with ``strict_band_edges``)."""
    out[ratio_key] = ratio
    term = band_term(ratio, band)
    if term is None or (fixes.strict_band_edges and term == 0.0):
        return False
    out[f"level_{level}"], out["levels_passed"] = term, float(level)
    return True


def _finish(out: Dict[str, float]) -> Dict[str, float]:
    out["reward"] = out["level_1"] + out["level_2"] + out["level_3"] + out["level_4"]
    return out
