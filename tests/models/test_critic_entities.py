"""Every actor/critic entity rule of IAC and MAAC, and its error (raised before any model loads)."""

import pytest
import torch
from tests.helpers.common import length_ratio
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.models.value_head import CausalLMWithValueHead
from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

DUMMY = "/nonexistent/dummy-model"  # loading it would fail: an error naming a rule proves no load happened
BASE = dict(num_turns=1, max_new_tokens=4, num_train_epochs=1, verbose=False)


def iac(**overrides):
    return IACConfig(**{**BASE, **overrides})


def maac(**overrides):
    return MAACConfig(**{**BASE, **overrides})


@pytest.fixture(scope="module")
def toks(tiny_paths):
    return {name: AutoTokenizer.from_pretrained(path) for name, path in tiny_paths.items()}


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: IACTrainer(agent_model=DUMMY, critic_model=DUMMY, reward_func=None, args=iac()), "reward_func"),
        (lambda: MAACTrainer(critic_model=DUMMY, reward_func=length_ratio, args=maac()), "Either agent_model or agents"),
        (lambda: IACTrainer(agent_model=DUMMY, critic_model=DUMMY, reward_func=length_ratio, args=iac(use_separate_critic=False)), "use_separate_critic"),
        (lambda: IACTrainer(agent_model=DUMMY, critics=[DUMMY, DUMMY], reward_func=length_ratio, args=iac(use_separate_critic=False)), "use_separate_critic"),
        (lambda: IACTrainer(agents=[DUMMY, DUMMY], critic_model=DUMMY, reward_func=length_ratio, args=iac()),
         rf"Tokenizer must be provided when using agents.* Add tokenizer=\['{DUMMY}', '{DUMMY}'\] \(each folder or id holds its tokenizer\)"),
        (lambda: MAACTrainer(agents=[DUMMY, DUMMY], critic_model=DUMMY, reward_func=length_ratio, args=maac()),
         rf"Tokenizer must be provided when using agents.* Add tokenizer=\['{DUMMY}', '{DUMMY}'\]"),
        (lambda: IACTrainer(agent_model=DUMMY, critic_model=DUMMY, reward_func=length_ratio, args=iac(num_turns=2)), "external_transition"),
        (lambda: MAACTrainer(agent_model=DUMMY, reward_func=length_ratio, args=maac()), "critics must be provided for MAAC"),
        (lambda: IACTrainer(agent_model=DUMMY, reward_func=length_ratio, args=iac()), "critics must be provided when use_separate_critic=True"),
        (lambda: MAACTrainer(agent_model=DUMMY, critics=[DUMMY, DUMMY], reward_func=length_ratio, args=maac()), r"critics length \(2\) must match 1 critic"),
        (lambda: IACTrainer(agent_model=DUMMY, critics=[DUMMY], reward_func=length_ratio, args=iac()), r"critics length \(1\) must match num_agents \(2\)"),
        (lambda: IACTrainer(agent_model=DUMMY, critic_model=DUMMY, critics=[DUMMY, "/other"], reward_func=length_ratio, args=iac()), "critic_model and critics conflict"),
        (lambda: MAACTrainer(agents=[DUMMY], tokenizer=object(), critic_model=DUMMY, reward_func=length_ratio, args=maac(num_agents=2)), r"args.num_agents \(2\) does not match"),
        (lambda: IACTrainer(agent_model=DUMMY, critic_model=DUMMY, reward_func=length_ratio, model_config={"critic_value_head_hidden_dim": 4}, args=iac(critic_value_head_hidden_dim=8)), "set it once"),
    ],
)
def test_rules_are_checked_before_loading(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_model_object_cannot_be_copied_into_several_agents(tiny_paths):
    model = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    with pytest.raises(ValueError, match="pretrained identifier string"):
        MAACTrainer(agent_model=model, critic_model=DUMMY, reward_func=length_ratio, args=maac())


def test_the_same_critic_object_twice_in_critics_is_refused(tiny_paths, toks):
    critic = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    with pytest.raises(ValueError, match="same model object"):
        IACTrainer(agent_model=DUMMY, critics=[critic, critic], reward_func=length_ratio, args=iac())


@pytest.mark.parametrize("config", [dict(num_generations=0), dict(critic_type="w"), dict(parallel_training="mp", agent_devices="cpu")])
def test_config_rules(config):
    field = {"num_generations": "num_generations", "critic_type": "critic_type", "parallel_training": "critic_devices"}[next(iter(config))]
    with pytest.raises(ValueError, match=field):
        IACConfig(**config)
    if field == "critic_devices":  # value heads on the actors need no critic device
        IACConfig(use_separate_critic=False, **config)


def test_config_defaults_and_normalisation():
    a, m = IACConfig(critic_type=" Q ", critic_learning_rate=None, agent_learning_rate=1e-4), MAACConfig()
    assert a.critic_type == "q" and a.critic_learning_rate == 1e-4 and a.train_batch_size == 8
    assert (m.num_generations, m.num_turns, m.rollout_buffer_size, m.value_loss_coef, m.discount) == (1, 2, 8, 0.6, 1.0)
    assert (a.value_clip_range, a.use_separate_critic, a.early_termination_threshold, a.update_epochs) == (0.2, True, -0.2, 1)


def test_agent_model_id_loads_tokenizer_and_independent_critic_copies(tiny_paths):
    trainer = IACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio, args=iac())
    assert trainer.num_agents == 2 and trainer.model_name == tiny_paths["llama"]
    assert trainer.tokenizers[0].eos_token == "<eos>"
    c0, c1 = trainer.critics
    assert c0 is not c1 and c0.model.get_input_embeddings().weight.data_ptr() != c1.model.get_input_embeddings().weight.data_ptr()
    assert len({id(o) for o in trainer.critic_optimizers}) == 2 and trainer.critic_devices == trainer.agent_devices
    assert all(a.value_head is None for a in trainer.agents) and trainer.critic_type == "v"
    assert sorted(trainer.named_optimizers()) == ["agent_optimizers.0", "agent_optimizers.1", "critic_optimizers.0", "critic_optimizers.1"]


def test_broadcast_critic_object_is_one_shared_critic(tiny_paths):
    shared = AutoModelForCausalLM.from_pretrained(tiny_paths["llama"])
    trainer = IACTrainer(agent_model=tiny_paths["llama"], critic_model=shared, reward_func=length_ratio, args=iac())
    assert trainer.critics[0] is trainer.critics[1] and trainer.critics[0].model is shared
    assert trainer.critic_optimizers[0] is trainer.critic_optimizers[1]
    assert [n for n in trainer.named_models() if n.startswith("critics")] == ["critics.0"]
    assert [n for n in trainer.named_optimizers() if n.startswith("critic")] == ["critic_optimizers.0"]


def test_shared_heads_live_on_the_actors(tiny_paths):
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=length_ratio, args=iac(use_separate_critic=False, value_head_hidden_dim=8))
    assert trainer.critics == [] and trainer.critic_optimizers == [] and trainer.critic_devices == []
    for agent, optimizer in zip(trainer.agents, trainer.agent_optimizers):
        assert isinstance(agent, CausalLMWithValueHead) and agent.value_head.pre_projection is not None
        head_params = {id(p) for p in agent.value_head.parameters()}
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        assert head_params <= optimized  # the head is trained by the actor's optimizer


def test_heterogeneous_maac_and_critic_tokenizer_compatibility(tiny_paths, toks):
    trainer = MAACTrainer(
        agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=[toks["llama"], toks["gpt2"]],
        critics=[tiny_paths["llama"]], reward_func=length_ratio, args=maac(critic_value_head_hidden_dim=4),
    )
    assert len(trainer.critics) == 1 and trainer.critic_device == trainer.agent_devices[0]
    assert trainer.critics[0].value_head.pre_projection[0].out_features == 4
    assert [t.eos_token for t in trainer.tokenizers] == ["<eos>", "<|endoftext|>"]
    assert isinstance(trainer.critic_optimizer, torch.optim.AdamW)
    # the central critic reads the first agent's tokens: a gpt2 first agent does not fit a llama critic
    with pytest.raises(ValueError, match=r"critics\[0\] reads the token ids of the tokenizer of agents\[0\]"):
        MAACTrainer(agents=[tiny_paths["gpt2"], tiny_paths["llama"]], tokenizer=[toks["gpt2"], toks["llama"]],
                    critic_model=tiny_paths["llama"], reward_func=length_ratio, args=maac())
    # IAC critic i reads agent i's tokens
    with pytest.raises(ValueError, match=r"critics\[1\] reads the token ids"):
        IACTrainer(agents=[tiny_paths["llama"], tiny_paths["gpt2"]], tokenizer=[toks["llama"], toks["gpt2"]],
                   critics=[tiny_paths["gpt2"], tiny_paths["llama"]], reward_func=length_ratio, args=iac())


def test_agents_and_matching_agent_model_and_critic_names(tiny_paths, toks):
    trainer = IACTrainer(
        agent_model=tiny_paths["llama"], agents=[tiny_paths["llama"]] * 2, tokenizer=toks["llama"],
        critic_model=tiny_paths["llama"], critics=[tiny_paths["llama"]] * 2, reward_func=length_ratio, args=iac(),
    )
    assert len(trainer.agents) == 2 and len(trainer.critics) == 2


def test_tokenizer_list_is_honoured_with_agent_model(tiny_paths, toks):
    other = AutoTokenizer.from_pretrained(tiny_paths["llama"])
    trainer = MAACTrainer(agent_model=tiny_paths["llama"], tokenizer=[toks["llama"], other], critic_model=tiny_paths["llama"],
                          reward_func=length_ratio, args=maac())
    assert trainer.tokenizers[0] is toks["llama"] and trainer.tokenizers[1] is other


def test_wrapped_actor_objects_are_used_as_given(tiny_paths, toks):
    actors = [CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_paths["llama"]), attach_value_head=False) for _ in range(2)]
    trainer = IACTrainer(agents=actors, tokenizer=toks["llama"], reward_func=length_ratio, args=iac(use_separate_critic=False))
    assert trainer.agents[0] is actors[0] and actors[0].value_head is not None  # a head was attached for shared mode


def test_wandb_run_config_of_the_actor_critic_trainers(tiny_paths, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is an optional dependency")
    runs = []

    class Run:
        id, project, entity = "run-1", "p", None

        def __init__(self, **kwargs):
            self.kwargs, self.rows = kwargs, []
            runs.append(self)

        def log(self, row, step):
            self.rows.append((step, row))

    monkeypatch.setattr(wandb, "run", None)
    monkeypatch.setattr(wandb, "init", lambda **kwargs: Run(**kwargs))
    trainer = IACTrainer(agent_model=tiny_paths["llama"], reward_func=length_ratio, args=iac(use_separate_critic=False),
                         wandb_config={"project": "p", "config_sections": {"output": {"verbose": False}}})
    assert trainer.wandb_initialized and not trainer.verbose
    config = runs[0].kwargs["config"]
    assert config["algorithm"] == "IAC" and config["num_agents"] == 2 and config["use_separate_critic"] is False
    assert {"critic_type", "value_loss_coef", "reference_kl_enabled", "critic_learning_rate"} <= set(config)
    MAACTrainer(agent_model=tiny_paths["llama"], critic_model=tiny_paths["llama"], reward_func=length_ratio, args=maac(),
                wandb_config={"project": "p"})
    assert runs[1].kwargs["config"]["algorithm"] == "MAAC" and "num_generations" in runs[1].kwargs["config"]
