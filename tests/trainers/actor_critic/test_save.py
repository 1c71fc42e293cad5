"""save_model layouts of IAC and MAAC, and the documented MAAC continuation example."""

import os

import pytest
import torch
from tests.helpers.common import changed, length_ratio, snapshot
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

BASE = dict(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False, rollout_buffer_size=4,
            agent_learning_rate=1e-3, critic_learning_rate=1e-3, eval_interval=0, weight_decay=0.0)


def files(path):
    return sorted(os.listdir(path))


def same_parameters(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_maac_save_restore_value_head_and_continue(tiny_paths, prompts_dataset, tmp_path):
    toks = [AutoTokenizer.from_pretrained(tiny_paths["llama"]), AutoTokenizer.from_pretrained(tiny_paths["gpt2"])]
    model_config = {"critic_value_head_hidden_dim": 8}
    trainer = MAACTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=toks, critic_model=tiny_paths["llama"],
                          reward_func=length_ratio, model_config=model_config, args=MAACConfig(**BASE), train_dataset=prompts_dataset)
    trainer.train()
    out = str(tmp_path / "maac")
    trainer.save_model(out)
    assert files(out) == ["agent_0", "agent_1", "critic"]
    assert "value_head.pt" in files(f"{out}/critic") and "config.json" in files(f"{out}/critic")
    assert not any(name.startswith("tokenizer") for name in files(f"{out}/critic"))
    assert "tokenizer.json" in files(f"{out}/agent_1") and "value_head.pt" not in files(f"{out}/agent_0")
    assert AutoModelForCausalLM.from_pretrained(f"{out}/agent_1").config.model_type == "gpt2"

    # The continuation example: saved actors and critic as ids, then the saved head loaded by hand.
    agent_dirs = [f"{out}/agent_0", f"{out}/agent_1"]
    resumed = MAACTrainer(
        agents=agent_dirs, tokenizer=[AutoTokenizer.from_pretrained(d) for d in agent_dirs], critic_model=f"{out}/critic",
        reward_func=length_ratio, model_config=model_config, args=MAACConfig(**BASE), train_dataset=prompts_dataset,
    )
    resumed.critics[0].value_head.load_state_dict(torch.load(f"{out}/critic/value_head.pt", weights_only=True))
    assert same_parameters(resumed.critics[0], trainer.critics[0])
    assert all(same_parameters(a, b) for a, b in zip(resumed.agents, trainer.agents))
    before = snapshot(resumed.critics[0])
    resumed.train()
    assert changed(resumed.critics[0], before)
    with pytest.raises(FileExistsError, match="overwrite"):
        resumed.save_model(out)
    resumed.save_model(out, overwrite=True)
    assert same_parameters(AutoModelForCausalLM.from_pretrained(f"{out}/critic"), resumed.critics[0].model)


def test_a_head_of_another_width_is_refused_with_a_clear_error(tiny_paths, tmp_path):
    trainer = MAACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
                          args=MAACConfig(**BASE, critic_value_head_hidden_dim=8))
    trainer.save_model(str(tmp_path))
    other = MAACTrainer(agent_model=tiny_paths["llama"], critic_model=str(tmp_path / "critic"), reward_func=length_ratio,
                        args=MAACConfig(**BASE))  # a fresh head: nothing is restored behind the user's back
    with pytest.raises(ValueError, match="value-head hidden dim"):
        other.critics[0].load_value_head(str(tmp_path / "critic"))
    with pytest.raises(RuntimeError):  # the manual restore of the docs fails loudly too
        other.critics[0].value_head.load_state_dict(torch.load(tmp_path / "critic" / "value_head.pt", weights_only=True))
    with pytest.raises(FileNotFoundError, match="No value head"):
        other.critics[0].load_value_head(str(tmp_path / "agent_0"))


def test_iac_separate_critics_are_saved_inside_each_agent(tiny_paths, prompts_dataset, tmp_path):
    trainer = IACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio,
                         args=IACConfig(**BASE), train_dataset=prompts_dataset)
    trainer.train()
    trainer.save_model(str(tmp_path))
    for i in range(2):
        agent_dir = tmp_path / f"agent_{i}"
        assert "critic" in files(agent_dir) and "value_head.pt" not in files(agent_dir)
        assert {"config.json", "value_head.pt"} <= set(files(agent_dir / "critic"))
    # a saved critic directory given back as a critic restores its backbone and gets a NEW head (as the
    # training-entities docs say); keeping the learned head is the user's explicit step
    critic_dirs = [str(tmp_path / f"agent_{i}" / "critic") for i in range(2)]
    restored = IACTrainer(agent_model=tiny_paths["llama"], critics=critic_dirs, reward_func=length_ratio, args=IACConfig(**BASE))
    for new, old in zip(restored.critics, trainer.critics):
        assert same_parameters(new.model, old.model) and not same_parameters(new.value_head, old.value_head)
    for critic, directory in zip(restored.critics, critic_dirs):
        critic.load_value_head(directory)
    assert all(same_parameters(a, b) for a, b in zip(restored.critics, trainer.critics))


def test_iac_shared_heads_are_saved_with_their_actors(tiny_paths, prompts_dataset, tmp_path):
    config = IACConfig(**BASE, use_separate_critic=False, value_head_hidden_dim=4)
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=length_ratio, args=config, train_dataset=prompts_dataset)
    trainer.train()
    trainer.save_model(str(tmp_path))
    assert files(tmp_path) == ["agent_0", "agent_1"]
    assert "value_head.pt" in files(tmp_path / "agent_0") and "critic" not in files(tmp_path / "agent_0")
    dirs = [str(tmp_path / f"agent_{i}") for i in range(2)]
    restored = IACTrainer(agents=dirs, tokenizer=trainer.tokenizer, reward_func=length_ratio, args=config)
    for a, b, directory in zip(restored.agents, trainer.agents, dirs):
        assert same_parameters(a.model, b.model) and not same_parameters(a.value_head, b.value_head)  # a new head
        a.load_value_head(directory)
        assert same_parameters(a.value_head, b.value_head)


def test_iac_single_agent_writes_into_the_output_dir(tiny_paths, tmp_path):
    trainer = IACTrainer(agent_model=tiny_paths["gpt2"], critic_model=tiny_paths["gpt2"], reward_func=lambda c: [0.0] * len(c),
                         args=IACConfig(**{**BASE, "num_agents": 1}))
    (tmp_path / "metrics.jsonl").write_text("{}\n")  # other files of the run stay where they are
    trainer.save_model(str(tmp_path))
    assert {"config.json", "critic", "metrics.jsonl", "tokenizer.json"} <= set(files(tmp_path))
    assert "value_head.pt" in files(tmp_path / "critic") and not any(n.startswith(".staging") for n in files(tmp_path))
    with pytest.raises(FileExistsError, match="config.json"):
        trainer.save_model(str(tmp_path))
    trainer.save_model(str(tmp_path), overwrite=True)
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"
