"""Writing rewards (TLDR, arXiv): hand-worked cases per level, the kept quirks and their fixes."""

from __future__ import annotations

import pytest

from comlrl.envs import get_environment

C1 = "The cat sat on the warm mat today"
# 8 tokens; 3+3+3+2+3+4+3+5 = 26 letters + 7 spaces = 33 chars; words {the, cat, sat, on, warm, mat, today} = 7;
# without stopwords (the, on): {cat, sat, warm, mat, today} = 5.
C2 = "cat dog fox owl elk yak emu gnu bee ant cow pig ram hen thus"
# 15 distinct words: 14 x 3 letters + "thus" (4) = 46 + 14 spaces = 60 chars; no stopwords; the only transition
# phrase inside it is "thus" (cause_effect).


def tldr(c1, c2, **options):
    env = get_environment("tldr", **options)
    return env.reward_details([c1], [c2], batch_items=[{"prompt": "post"}])[0]


def test_tldr_level_1_token_range():
    # level 1 needs 8..256 whitespace tokens in both texts; failing it scores 0 and stops
    assert tldr("too short to count", C2)["reward"] == 0.0
    assert tldr(C1, "word " * 257)["reward"] == 0.0
    eight = "a b c d e f g h"
    assert tldr(eight, eight)["level_1"] == 0.5


def test_tldr_level_2_outside_the_band_stops():
    # identical texts: length ratio 1.0 < 1.1 -> level 2 fails, reward = level 1 = 0.5
    details = tldr(C1, C1)
    assert details["reward"] == 0.5 and details["level_2"] == 0.0 and details["levels_passed"] == 1.0


def test_tldr_level_2_ramp_and_level_3_failure():
    c1 = "alpha beta gamma delta epsilon zeta eta theta"  # 38 letters + 7 spaces = 45 chars, 8 words
    c2 = c1 + " alpha beta gamma"  # 62 chars, still 8 distinct words
    details = tldr(c1, c2)
    # ratio 62/45 = 1.3778 in [1.1, 1.6): level 2 = (r - 1.1) / (1.6 - 1.1) = 0.5556
    assert details["level_2"] == pytest.approx((62 / 45 - 1.1) / 0.5)
    # unique-word ratio 8/8 = 1.0 < 1.3: level 3 fails, scoring stops
    assert details["level_3"] == 0.0 and details["level_4"] == 0.0
    assert details["reward"] == pytest.approx(0.5 + (62 / 45 - 1.1) / 0.5)


def test_tldr_all_four_levels():
    details = tldr(C1, C2)
    # level 2: 60/33 = 1.818 in [1.6, 3.2] -> 1.0;  level 3: 15/7 = 2.14 >= 2.0 -> 0.5
    # level 4: T = 0.4 (one category); J = |{cat}| / |5 + 15 - 1| = 1/19 = 0.0526 >= 0.03 -> 1.0;
    #          0.4 * 0.4 + 0.6 * 1.0 = 0.76
    assert (details["level_1"], details["level_2"], details["level_3"]) == (0.5, 1.0, 0.5)
    assert details["transition_categories"] == 1.0 and details["jaccard"] == pytest.approx(1 / 19)
    assert details["level_4"] == pytest.approx(0.76)
    assert details["reward"] == pytest.approx(2.76)
    assert details["reward"] == pytest.approx(sum(details[f"level_{k}"] for k in range(1, 5)))


def test_tldr_level_3_ramp():
    c1 = "alpha beta gamma delta epsilon zeta eta theta"  # 45 chars, 8 distinct non-stopwords
    c2 = c1 + " iota kappa lambda omicronomicron"  # 45 + 5 + 6 + 7 + 15 = 78 chars, 12 distinct words
    details = tldr(c1, c2)
    # level 2: 78/45 = 1.733 -> 1.0; level 3: ratio 12/8 = 1.5 in [1.3, 2.0): 0.5 * (1.5 - 1.3) / 0.7 = 0.142857
    # level 4: no transition phrase (T = 0); J = 8/12 -> capped -> 1.0; 0.6 * 1.0 = 0.6
    assert details["level_3"] == pytest.approx(0.5 * 0.2 / 0.7)
    assert details["level_4"] == pytest.approx(0.6)
    assert details["reward"] == pytest.approx(0.5 + 1.0 + 0.5 * 0.2 / 0.7 + 0.6)


def test_tldr_band_edge_quirk_and_its_fix():
    c1 = "a b c d e f g " + "h" * 16  # 7 + 16 letters + 7 spaces = 30 chars, 8 tokens, 8 distinct words
    c2 = "a b c d e f g h i j k l m n o pqr"  # 15 + 3 letters + 15 spaces = 33 chars, 16 distinct words
    # ratio 33/30 = 1.1 exactly, the band's outer edge: level 2 = 0 but (original) the gate passes
    original = tldr(c1, c2)
    # level 3: 16/8 = 2.0 -> 0.5; level 4: T = 0; content words without "a", "i": J = 6/15 = 0.4 -> 1.0 -> 0.6
    assert (original["level_2"], original["level_3"], original["level_4"]) == (0.0, 0.5, pytest.approx(0.6))
    assert original["reward"] == pytest.approx(1.6)
    fixed = tldr(c1, c2, strict_band_edges=True)
    assert fixed["reward"] == 0.5 and fixed["levels_passed"] == 1.0


def test_tldr_transition_substring_quirk_and_its_fix():
    c2 = C2.replace("thus", "also")  # "also" (elaboration) contains "so" (cause_effect)
    # substring matching: 2 categories -> T = 0.45; "also" is a stopword, so J = 1/18 -> 1.0
    original = tldr(C1, c2)
    assert original["transition_categories"] == 2.0
    assert original["level_4"] == pytest.approx(0.4 * 0.45 + 0.6)
    fixed = tldr(C1, c2, transition_word_boundaries=True)
    assert fixed["transition_categories"] == 1.0 and fixed["level_4"] == pytest.approx(0.4 * 0.4 + 0.6)


def test_transition_score_cap_quirk_and_its_fix():
    from comlrl.envs.writing.rewards import transition_score

    # original: 0.4 + min(0.05 (n - 1), 0.6), so 12 categories give 0.4 + 0.55 = 0.95, never 1.0
    assert transition_score(12) == pytest.approx(0.95)
    assert transition_score(1) == 0.4 and transition_score(0) == 0.0
    # fix: 0.4 + 0.6 (n - 1) / 11
    assert transition_score(12, full_scale=True) == pytest.approx(1.0)
    assert transition_score(6, full_scale=True) == pytest.approx(0.4 + 0.6 * 5 / 11)


def test_vocabulary_stopword_option():
    c1 = "the the the the the the the cat"  # 8 tokens, words {the, cat}
    c2 = "the cat and the dog were in the big old barn of a farm near the sea"
    original = tldr(c1, c2)
    fixed = tldr(c1, c2, vocabulary_excludes_stopwords=True)
    # original counts stopwords: |{the, cat, and, dog, were, in, big, old, barn, of, a, farm, near, sea}| / 2 = 7
    # without them: |{cat, dog, big, barn, farm, near, sea}| / |{cat}| = 7 as well -> same level 3 here
    assert original["unique_words_ratio"] == 7.0 and fixed["unique_words_ratio"] == 7.0


def arxiv_words(prefix: str, count: int, width: int):
    return " ".join(f"{prefix}{i:0{width - len(prefix)}d}" for i in range(count))


def test_arxiv_levels():
    env = get_environment("arxiv")

    def details(c1, c2):
        return env.reward_details([c1], [c2], batch_items=[{"abstract_text": "x"}])[0]

    c1 = arxiv_words("a", 130, 4)  # 130 distinct 4-char tokens: 520 + 129 = 649 chars
    # level 1: 127 tokens is below arXiv's 128..256 range
    assert details(arxiv_words("a", 127, 4), c1)["reward"] == 0.0
    # full levels 1-3, empty level 4: c2 = 130 distinct 6-char tokens: 780 + 129 = 909 chars
    c2 = arxiv_words("b", 130, 6)
    d = details(c1, c2)
    # level 2: 909/649 = 1.4006 in [1.3, 1.6] -> 1.0; level 3: 130/130 = 1.0 in [0.7, 1.3] -> 0.5
    # level 4: no phrase in c1 + c2, disjoint word sets (J = 0) -> 0.0
    assert (d["level_1"], d["level_2"], d["level_3"], d["level_4"]) == (0.5, 1.0, 0.5, 0.0)
    # level 2 ramp on [0.8, 1.3): 130 distinct 5-char tokens
    c2 = arxiv_words("b", 130, 5)  # 650 + 129 = 779 chars: 779/649 = 1.2003 -> (1.2003 - 0.8) / 0.5 = 0.8006
    d = details(c1, c2)
    assert d["level_2"] == pytest.approx((779 / 649 - 0.8) / 0.5)
    # level 3 above the band: 256 distinct words vs 130 -> ratio 1.97 > 1.7 -> stop after level 2
    c2 = arxiv_words("c", 256, 4)  # 1024 + 255 = 1279 chars: 1279/649 = 1.9707 -> (2.0 - r)/0.4 ramp
    d = details(c1, c2)
    assert d["level_2"] == pytest.approx(1.0 - (1279 / 649 - 1.6) / 0.4)
    assert d["level_3"] == 0.0 and d["reward"] == pytest.approx(0.5 + d["level_2"])


def test_arxiv_transitions_are_read_in_both_texts():
    env = get_environment("arxiv")
    c1 = arxiv_words("a", 129, 4) + " moreover"  # 130 tokens, 649 - 4 + 8 = 653 chars
    c2 = arxiv_words("b", 130, 6)  # 909 chars
    d = env.reward_details([c1], [c2], batch_items=[{"abstract_text": "x"}])[0]
    # c1 + c2 contains "moreover" (elaboration; "more" is no phrase): T = 0.4; J = 0 -> level 4 = 0.16
    assert d["transition_categories"] == 1.0 and d["level_4"] == pytest.approx(0.16)


def test_reward_func_is_one_value_per_joint_response_and_matches_details():
    env = get_environment("tldr")
    completions_1, completions_2 = [C1, C1, "short"], [C2, C1, C2]
    rewards = env.reward_func(completions_1, completions_2, batch_items=[{"prompt": "p"}])
    assert rewards == pytest.approx([2.76, 0.5, 0.0])
    with pytest.raises(ValueError, match="index-aligned"):
        env.reward_func([C1], [C2, C2], batch_items=[{"prompt": "p"}])
    with pytest.raises(ValueError, match="batch_items"):
        env.reward_func([C1, C1, C1], [C2, C2, C2], batch_items=[{"prompt": "p"}, {"prompt": "q"}])


def test_writing_is_single_turn():
    with pytest.raises(ValueError, match="single-turn"):
        get_environment("tldr", num_turns=2)
    assert get_environment("arxiv").external_transition is None
