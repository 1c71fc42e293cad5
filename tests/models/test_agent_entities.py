"""Training entities for agents: every rule of agent_model / agents / num_agents / tokenizer."""

import copy

import pytest
import torch
from tests.helpers.common import changed, length_ratio, snapshot
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models.sources import infer_model_name
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

# weight_decay=0: a model that changed got a gradient (AdamW's decay moves every weight on its own)
CFG = dict(num_turns=1, num_generations=2, max_new_tokens=6, num_train_epochs=1, verbose=False, agent_learning_rate=1e-3,
           weight_decay=0.0)


def build(**kwargs):
    kwargs.setdefault("reward_func", length_ratio)
    kwargs.setdefault("args", MAGRPOConfig(**CFG))
    return MAGRPOTrainer(**kwargs)


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if anything tries to load a model or tokenizer."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were validated")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", refuse)


# ----------------------------------------------------------------------------- homogeneous


def test_homogeneous_agents_are_independent_copies(tiny_paths, prompts_dataset):
    trainer = build(agent_model=tiny_paths["llama"], num_agents=3, train_dataset=prompts_dataset,
                    reward_func=lambda a, b, c: [len(x) - len(y) + len(z) / 2 for x, y, z in zip(a, b, c)],
                    args=MAGRPOConfig(**{**CFG, "num_agents": 3}))
    assert trainer.num_agents == 3 and len(trainer.agents) == 3 and len(trainer.optimizers) == 3
    params = [list(agent.parameters()) for agent in trainer.agents]
    for i in range(3):
        for j in range(i + 1, 3):
            assert all(a.data_ptr() != b.data_ptr() for a, b in zip(params[i], params[j]))
    assert trainer.model_name == tiny_paths["llama"]
    before = [snapshot(agent) for agent in trainer.agents]
    trainer.train()
    assert all(changed(agent, snap) for agent, snap in zip(trainer.agents, before))
    # trained separately: they no longer agree with each other
    assert changed(trainer.agents[1], snapshot(trainer.agents[0]))


def test_num_agents_defaults_to_config_and_explicit_config_must_agree(tiny_paths):
    trainer = build(agent_model=tiny_paths["llama"])
    assert trainer.num_agents == 2 == trainer.args.num_agents
    trainer = build(agent_model=tiny_paths["llama"], args=MAGRPOConfig(**{**CFG, "num_agents": 1}),
                    reward_func=lambda completions: [float(len(c)) for c in completions])
    assert trainer.num_agents == 1


def test_single_model_object_can_not_be_shared_by_several_agents(tiny_paths, no_loading):
    model = object.__new__(torch.nn.Linear)
    torch.nn.Module.__init__(model)
    with pytest.raises(ValueError, match="agent_model should be a string to create homogeneous agents"):
        build(agent_model=model, num_agents=2, tokenizer=object())


def test_neither_agent_model_nor_agents(no_loading):
    with pytest.raises(ValueError, match="Either agent_model or agents"):
        build()


# ----------------------------------------------------------------------------- heterogeneous


def test_heterogeneous_agents_with_own_tokenizers_train_and_both_change(tiny_paths, prompts_dataset):
    trainer = build(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], train_dataset=prompts_dataset)
    assert trainer.num_agents == 2
    assert type(trainer.agents[0]).__name__ == "LlamaForCausalLM"
    assert type(trainer.agents[1]).__name__ == "GPT2LMHeadModel"
    # each agent got its own tokenizer, loaded from its own directory
    assert len(trainer.tokenizers[0]) != len(trainer.tokenizers[1])
    assert trainer.tokenizers[1].eos_token == "<|endoftext|>"
    before = [snapshot(agent) for agent in trainer.agents]
    trainer.train()
    assert changed(trainer.agents[0], before[0]) and changed(trainer.agents[1], before[1])


def test_loaded_model_objects_require_tokenizers(tiny_paths, no_loading):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"tokenizer is required because agents\[1\]"):
        build(agents=[tiny_paths["llama"], model])


def test_mixed_string_and_object_agents_with_tokenizer_list(tiny_paths, prompts_dataset):
    gpt2 = AutoModelForCausalLM.from_pretrained(tiny_paths["gpt2"])
    toks = [AutoTokenizer.from_pretrained(tiny_paths["llama"]), AutoTokenizer.from_pretrained(tiny_paths["gpt2"])]
    trainer = build(agents=[tiny_paths["llama"], gpt2], tokenizer=toks, train_dataset=prompts_dataset)
    assert trainer.agents[1] is gpt2 and trainer.tokenizers[1] is toks[1]
    before = snapshot(gpt2)
    trainer.train()
    assert changed(gpt2, before)


def test_same_model_object_twice_is_refused(tiny_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    with pytest.raises(ValueError, match=r"agents\[0\] and agents\[1\] are the same model object"):
        build(agents=[model, model], tokenizer=tok)
    trainer = build(agents=[model, copy.deepcopy(model)], tokenizer=tok)
    assert trainer.agents[0] is not trainer.agents[1]


def test_tokenizer_list_length_must_match(tiny_paths, no_loading):
    with pytest.raises(ValueError, match=r"tokenizer length \(3\) must match the number of agents \(2\)"):
        build(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=[object(), object(), object()])


def test_shared_tokenizer_too_large_for_an_agent_is_refused(tiny_paths):
    gpt2_tok = AutoTokenizer.from_pretrained(tiny_paths["gpt2"])
    rows = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"]).get_input_embeddings().num_embeddings
    assert len(gpt2_tok) > rows
    with pytest.raises(ValueError, match=rf"agents\[0\] has {len(gpt2_tok)} tokens but the model's embedding has only {rows} rows"):
        build(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=gpt2_tok)


# ----------------------------------------------------------------------------- agent_model + agents


def test_agent_model_and_agents_must_name_the_same_model(tiny_paths, no_loading):
    with pytest.raises(ValueError, match=r"agent_model and agents conflict: .*agents\[1\]"):
        build(agent_model=tiny_paths["llama"], agents=[tiny_paths["llama"], tiny_paths["gpt2"]])


def test_agent_model_and_agents_length_must_match_num_agents(tiny_paths, no_loading):
    with pytest.raises(ValueError, match=r"num_agents \(3\) does not match len\(agents\) \(2\)"):
        build(agent_model=tiny_paths["llama"], agents=[tiny_paths["llama"]] * 2, num_agents=3)
    with pytest.raises(ValueError, match=r"args.num_agents \(3\) does not match the 2 agents"):
        build(agents=[tiny_paths["llama"]] * 2, args=MAGRPOConfig(**{**CFG, "num_agents": 3}))


def test_agent_model_and_matching_agents_load(tiny_paths):
    trainer = build(agent_model=tiny_paths["llama"], agents=[tiny_paths["llama"], tiny_paths["llama"]])
    assert trainer.num_agents == 2 and trainer.agents[0] is not trainer.agents[1]


def test_agents_must_be_a_list(tiny_paths, no_loading):
    with pytest.raises(ValueError, match="agents must be a list"):
        build(agents=tiny_paths["llama"])


def test_model_object_name_is_its_path_never_its_model_type(tiny_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    assert infer_model_name(model) == tiny_paths["llama"]
    model.config._name_or_path = ""
    assert infer_model_name(model) is None  # 1.4.3 answered "llama", which is not a loadable name
    tok = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    with pytest.raises(ValueError, match="without a name to compare"):
        build(agent_model=model, agents=[model], num_agents=1, tokenizer=tok, args=MAGRPOConfig(**{**CFG, "num_agents": 1}))


# ----------------------------------------------------------------------------- other arguments


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(reward_func=None), "reward_func must be a callable"),
        (dict(reward_func="not callable"), "reward_func must be a callable"),
        (dict(reward_func=lambda a, b, c: [0.0]), "cannot take the completions of 2 agent"),
        (dict(formatters=[str.upper] * 3), "Number of formatters must match num_agents"),
        (dict(formatters=42), "formatters must be None, a callable or a list"),
        (dict(args=MAGRPOConfig(num_generations=2)), "Multi-turn MAGRPO requires an external_transition"),
        (dict(external_transition="nope"), "external_transition must be callable"),
        (dict(args=MAGRPOConfig(**{**CFG, "agent_devices": "cuda:7"})), "CUDA is not available|only"),
        (dict(args=MAGRPOConfig(**{**CFG, "agent_devices": ["cpu", "cpu", "cpu"]})), r"agent_devices length \(3\) must be 1 or 2"),
        (dict(model_config={"torch_dtype": "float8"}), "dtype 'float8' is not understood"),
        (dict(args="MAGRPOConfig"), "args must be a MAGRPOConfig"),
    ],
)
def test_bad_arguments_raise_before_loading(tiny_paths, no_loading, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], **kwargs)


def test_missing_model_directory_names_the_agent(tmp_path):
    with pytest.raises(ValueError, match=r"agents\[0\] '.*no-such-model' does not exist"):
        build(agents=[str(tmp_path / "no-such-model"), str(tmp_path / "no-such-model")])


def test_plain_config_takes_the_trainers_baseline_unless_set(tiny_paths):
    from comlrl.trainers.reinforce import MARLOOTrainer

    trainer = MARLOOTrainer(agents=[tiny_paths["llama"]] * 2, reward_func=length_ratio, args=MAGRPOConfig(**CFG))
    assert trainer.args.advantage_mode == "rloo"
    chosen = MAGRPOConfig(**CFG, advantage_mode="mean")
    trainer = MARLOOTrainer(agents=[tiny_paths["llama"]] * 2, reward_func=length_ratio, args=chosen)
    assert trainer.args.advantage_mode == "mean"
    assert chosen is not trainer.args  # the caller's config is never modified
