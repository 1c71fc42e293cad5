"""The writing tasks' bundled samples: enough distinct prompts for a learning run offline, in the real
schema, with the original sample's rows first (so ``[:2]``-style slices select what they did)."""

from __future__ import annotations

import re

import pytest

from comlrl.envs import get_environment
from comlrl.envs.sources import sample_rows

POST = re.compile(r"\ASUBREDDIT: r/(\w+)\n\nTITLE: ([^\n]+)\n\nPOST: ([^\n]+)\n\nTL;DR:\Z")


def tldr_parts(row):
    match = POST.match(row["prompt"])
    assert match, f"not in the trl-lib/tldr prompt layout: {row['prompt'][:80]!r}"
    return match.groups()


def test_tldr_sample_sizes_layout_and_distinct_posts():
    train, evaluation = sample_rows("tldr.json", "train"), sample_rows("tldr.json", "eval")
    assert len(train) >= 48 and len(evaluation) >= 12
    rows = train + evaluation
    titles = [tldr_parts(row)[1] for row in rows]
    assert len(set(titles)) == len(rows)  # distinct titles, so no post appears twice or in both splits
    assert len({tldr_parts(row)[0] for row in rows}) >= 30  # varied subreddits
    for row in rows:
        words = len(tldr_parts(row)[2].split())
        assert 60 <= words <= 200, (words, row["prompt"][:60])
        completion = row["completion"]
        assert completion.startswith(" ") and "\n" not in completion and 5 <= len(completion.split()) <= 30
        assert (row["prompt"] + completion).isascii()


def test_the_original_rows_stay_first():
    train, evaluation = sample_rows("tldr.json", "train"), sample_rows("tldr.json", "eval")
    assert [tldr_parts(row)[1] for row in train[:4]] == [
        "My tomato plants keep splitting before they ripen, what am I doing wrong?",
        "Should I pay off my car loan early or keep the money in savings?",
        "My roommate never cleans up after cooking and I do not know how to bring it up",
        "Training for my first half marathon and my knee hurts after long runs",
    ]
    assert [tldr_parts(row)[1] for row in evaluation[:2]] == [
        "Why does my homemade bread come out dense every time?",
        "Got a job offer with higher pay but a much longer commute",
    ]
    arxiv_train, arxiv_eval = sample_rows("arxiv.json", "train"), sample_rows("arxiv.json", "eval")
    assert [row["article_id"] for row in arxiv_train[:4]] == [f"comlrl-sample-0{i}" for i in range(4)]
    assert [row["article_id"] for row in arxiv_eval[:2]] == ["comlrl-sample-04", "comlrl-sample-05"]
    assert arxiv_train[0]["abstract_text"].startswith("We study how small groups of language models")


def test_arxiv_sample_sizes_schema_and_distinct_abstracts():
    train, evaluation = sample_rows("arxiv.json", "train"), sample_rows("arxiv.json", "eval")
    assert len(train) >= 40 and len(evaluation) >= 10
    rows = train + evaluation
    assert len({row["article_id"] for row in rows}) == len(rows)
    assert len({row["abstract_text"] for row in rows}) == len(rows)
    for row in rows:
        text = row["abstract_text"]
        assert row["token_count"] == len(text.split()) and 100 <= row["token_count"] <= 200
        assert text.isascii() and "\n" not in text


@pytest.mark.parametrize("name", ["tldr", "arxiv"])
def test_offline_learning_run_gets_at_least_32_distinct_prompts(name):
    env = get_environment(name)
    rows = env.load_dataset("train", offline=True)
    for formatter in env.formatters:
        assert len({formatter(row) for row in rows}) >= 32
    assert env.data_sources["train"]["rows"] == len(rows)
    assert len(env.load_dataset("train", offline=True, hf_split="[:4]")) == 4  # the demos' slice
