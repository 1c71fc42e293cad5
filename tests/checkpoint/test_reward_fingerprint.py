"""A checkpoint remembers which reward function trained it: resuming with another one is refused (or,
asked for, warned about), an edited one is warned about."""

from __future__ import annotations

import functools

import pytest

from comlrl.checkpoint.files import CheckpointError
from comlrl.checkpoint.state import REWARD_CHANGE_ENV, check_reward_fingerprint, reward_fingerprint


def brief_reward(c1, c2):
    return [float(len(a) + 2 * len(b)) for a, b in zip(c1, c2)]


def other_reward(c1, c2):
    return [float(len(b) - len(a)) for a, b in zip(c1, c2)]


class Scorer:
    def __call__(self, c1, c2):
        return [0.5 for _ in c1]


def test_the_fingerprint_is_the_qualified_name_and_a_hash_of_the_source():
    print_ = reward_fingerprint(brief_reward)
    assert print_["name"] == f"{__name__}.brief_reward" and len(print_["source_sha256"]) == 64
    assert reward_fingerprint(brief_reward) == print_  # stable
    assert reward_fingerprint(other_reward)["source_sha256"] != print_["source_sha256"]
    assert reward_fingerprint(functools.partial(brief_reward))["name"] == print_["name"]
    assert reward_fingerprint(Scorer())["name"].endswith("Scorer")  # a callable object: its class
    assert reward_fingerprint(functools.wraps(brief_reward)(lambda c1, c2: brief_reward(c1, c2))) == print_  # a wrapper
    assert reward_fingerprint(max) == {"name": "max", "source_sha256": None}  # no Python source
    assert reward_fingerprint(None) is None


def test_another_function_is_refused_naming_both_and_the_override(monkeypatch):
    monkeypatch.delenv(REWARD_CHANGE_ENV, raising=False)
    with pytest.raises(CheckpointError) as info:
        check_reward_fingerprint(reward_fingerprint(brief_reward), reward_fingerprint(other_reward))
    message = str(info.value)
    assert "brief_reward" in message and "other_reward" in message and f"{REWARD_CHANGE_ENV}=1" in message
    monkeypatch.setenv(REWARD_CHANGE_ENV, "1")
    with pytest.warns(UserWarning, match=r"trained with .*brief_reward.*scores with .*other_reward.*continuing"):
        check_reward_fingerprint(reward_fingerprint(brief_reward), reward_fingerprint(other_reward))


def test_an_edited_function_is_warned_about_and_an_old_checkpoint_not_compared():
    saved = dict(reward_fingerprint(brief_reward), source_sha256="0" * 64)
    with pytest.warns(UserWarning, match=r"source of the reward function .*brief_reward changed"):
        check_reward_fingerprint(saved, reward_fingerprint(brief_reward))
    check_reward_fingerprint(None, reward_fingerprint(brief_reward))  # written before fingerprints: nothing to compare
    check_reward_fingerprint(reward_fingerprint(brief_reward), reward_fingerprint(brief_reward))


def test_resuming_a_real_checkpoint_with_another_reward_is_refused(tiny_paths, tmp_path):
    from datasets import Dataset

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    def make(reward):
        args = MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=3, num_train_epochs=1, verbose=False, eval_interval=0)
        return MAGRPOTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], reward_func=reward, args=args,
                             train_dataset=Dataset.from_dict({"prompt": ["Tell a joke", "Describe a city"]}))

    saved = make(brief_reward).save_checkpoint(str(tmp_path / "ck"))
    with pytest.raises(CheckpointError, match=r"brief_reward.*other_reward"):
        make(other_reward).train(resume_from_checkpoint=saved)
    make(brief_reward).train(resume_from_checkpoint=saved)  # the same function resumes
