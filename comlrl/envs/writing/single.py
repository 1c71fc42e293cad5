"""The single-agent baseline of the writing tasks (the task repository's ``train_grpo.py`` / ``train_ac.py``).

One agent writes both texts in one completion, separated by the ``[PARAGRAPH_SPLIT]`` marker; the
completion is split into the two parts and scored with the two-agent reward, part 1 in agent 1's
place and part 2 in agent 2's. The split, as in the original:

1. at the first ``[PARAGRAPH_SPLIT]`` when the marker occurs;
2. else before the first ``Paragraph 2:`` label (any case, and the whitespace after it dropped);
3. else at one third of the (stripped) text: ``cut = len(text) // 3``, at least 1.

Both parts are stripped, then a leading ``Paragraph 1:`` is removed from part 1 and a leading
``Paragraph 2:`` from part 2 (any case).
"""

from __future__ import annotations

import re
from typing import Dict, Tuple

MARKER = "[PARAGRAPH_SPLIT]"
SECOND_LABEL = re.compile(r"Paragraph 2:\s*", re.IGNORECASE)
LEADING_FIRST = re.compile(r"^Paragraph 1:\s*", re.IGNORECASE)
LEADING_SECOND = re.compile(r"^Paragraph 2:\s*", re.IGNORECASE)

SPLIT_MARKER, SPLIT_LABEL, SPLIT_THIRD = 1.0, 2.0, 3.0
"""How a completion was split (``reward_details["split"]``): at the marker, at the label, at one third."""


def split_paragraphs(text: str) -> Tuple[str, str, float]:
    """``(part 1, part 2, how)`` of one completion (see the module docstring)."""
    text = (text or "").strip()
    if MARKER in text:
        first, second = text.split(MARKER, 1)
        how = SPLIT_MARKER
    else:
        label = SECOND_LABEL.search(text)
        if label is not None:
            first, second, how = text[: label.start()], text[label.end():], SPLIT_LABEL
        else:
            cut = len(text) // 3 or 1
            first, second, how = text[:cut], text[cut:], SPLIT_THIRD
    first = LEADING_FIRST.sub("", first.strip(), count=1)
    second = LEADING_SECOND.sub("", second.strip(), count=1)
    return first, second, how


TLDR_SINGLE = (
    "Summarize the following Reddit post in exactly two paragraphs.\n\nPost:\n{text}\n\n"
    "Instructions:\n"
    "- Paragraph 1: a concise summary of the main points\n"
    "- Paragraph 2: the same summary in more detail, two to three times as long (in characters) as paragraph 1, "
    "with a richer vocabulary and transition words of as many kinds as you can, in the same style\n"
    "- Each paragraph has at least 10 and at most 200 words\n"
    f"- Put exactly this marker between the paragraphs: {MARKER}\n\n"
    f"Format:\nParagraph 1: ...\n{MARKER}\nParagraph 2: ...\n"
)
ARXIV_SINGLE = (
    "Expand the scientific abstract below into an introduction of exactly two paragraphs of the same length.\n\n"
    "Abstract:\n{text}\n\n"
    "Instructions:\n"
    "- Paragraph 1: the background and the motivation of the research, with transition words of as many kinds as you can\n"
    "- Paragraph 2: the framework, the method, the contribution and the implications, with as many distinct words as "
    "paragraph 1 and transition words of as many kinds as you can, in the same style\n"
    f"- Put exactly this marker between the paragraphs: {MARKER}\n\n"
    f"Format:\nParagraph 1: ...\n{MARKER}\nParagraph 2: ...\n"
)
SINGLE_PROMPTS: Dict[str, str] = {"tldr": TLDR_SINGLE, "arxiv": ARXIV_SINGLE}
