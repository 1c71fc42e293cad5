"""Comparators of the iterative trainers: who answers against the current policy each round.

- ``current``: the live agents, sampled on the comparator's own RNG stream;
- ``current_copy``: frozen copies on ``comparator_devices`` (the live agents when those are the
  agents' devices), refreshed in place from the agents at every round start;
- ``model``: fixed external models (``comparator_model_name`` / ``comparator_agents``), loaded once;
- ``history``: the policy at the start of round ``r - k`` (the initial policy before that): the
  last ``k`` round-start policies are kept as frozen copies, recycled in place;
- ``api``: an HTTP completion endpoint (``comlrl.adapters.completion_api.CompletionClient``).

Every comparator stays resident for the whole run. Generation is decentralized (each agent's
prompt answered by that agent's comparator generator) or centralized (one generator writes every
agent's part from the adapter's joint prompt; unparseable answers count as empty outputs).
Sampling swaps the global RNG of the generator's device to the comparator's stream and back, so
the current policy's own samples are the same whatever the comparator draws.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
import torch.nn as nn

from comlrl.models.loading import frozen_copy, load_models, resolve_model_kwargs
from comlrl.models.tokenizers import ensure_pad_token, load_tokenizers
from comlrl.rollout.generation import HFGenerator, SamplingParams
from comlrl.rollout.sampling import draw_seeds
from comlrl.trainers.preference.centralized import joint_prompt, split_completion
from comlrl.trainers.preference.collection import ItemCandidates
from comlrl.parallel.devices import resolve_devices


# ----------------------------------------------------------------------------- RNG streams
def _seeded_state(device: torch.device, seed: int) -> torch.Tensor:
    if device.type == "cpu":
        return torch.Generator().manual_seed(seed).get_state()
    if device.type == "cuda":
        saved = torch.cuda.get_rng_state(device)
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)
        state = torch.cuda.get_rng_state(device)
        torch.cuda.set_rng_state(saved, device)
        return state
    raise ValueError(f"comparator RNG streams support cpu and cuda devices, not {device}.")


class RngStreams:
    """One generator state per device, swapped in for the device's global RNG while a comparator samples."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.states: Dict[str, torch.Tensor] = {}

    @contextlib.contextmanager
    def active(self, device: torch.device) -> Iterator[None]:
        key = str(device)
        state = self.states.get(key)
        if state is None:
            state = _seeded_state(device, self.seed)
        if device.type == "cuda":
            saved = torch.cuda.get_rng_state(device)
            torch.cuda.set_rng_state(state, device)
        else:
            saved = torch.get_rng_state()
            torch.set_rng_state(state)
        try:
            yield
        finally:
            if device.type == "cuda":
                self.states[key] = torch.cuda.get_rng_state(device)
                torch.cuda.set_rng_state(saved, device)
            else:
                self.states[key] = torch.get_rng_state()
                torch.set_rng_state(saved)

    def state_dict(self) -> Dict[str, Any]:
        return {"seed": self.seed, "states": dict(self.states)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.seed, self.states = int(state["seed"]), dict(state["states"])


def comparator_seed() -> int:
    """A stream seed derived from torch's initial seed (nothing is drawn from the global RNG)."""
    return (torch.initial_seed() * 6364136223846793005 + 1442695040888963407) % (2**63)


# ----------------------------------------------------------------------------- the comparator
class Comparator:
    """Comparator candidates for batches of items (see the module docstring)."""

    def __init__(self, trainer: Any):
        a = trainer.args
        self.trainer = trainer
        self.policy = a.comparator_policy
        self.num_agents = trainer.num_agents
        # a centralized team's comparator answers the joint prompt directly, as its one "agent"
        self.centralized = a.comparator_generation_mode == "centralized" and trainer.collaboration is None
        self.index = a.comparator_centralized_agent_index
        self.streams = RngStreams(comparator_seed())
        self.devices = resolve_devices(a.comparator_devices, self.num_agents, "comparator_devices") if a.comparator_devices is not None else list(trainer.agent_devices)
        self.generators: List[Optional[HFGenerator]] = [None] * self.num_agents
        self.history: deque = deque()  # (policy round label, [models]) oldest first
        self.client: Any = None
        self.unparsed = 0
        builder = getattr(self, f"_build_{self.policy}")
        builder()

    # ------------------------------------------------------------------ construction per policy
    def _build_current(self) -> None:
        self.generators = [p.generator for p in self.trainer.policies]

    def _separate_copies(self) -> bool:
        return self.devices != list(self.trainer.agent_devices)

    def _copies(self) -> List[nn.Module]:
        return [frozen_copy(p.model, device) for p, device in zip(self.trainer.policies, self.devices)]

    def _generators_for(self, models: Sequence[nn.Module]) -> List[HFGenerator]:
        return [HFGenerator(m, p.tokenizer, d) for m, p, d in zip(models, self.trainer.policies, self.devices)]

    def _build_current_copy(self) -> None:
        if not self._separate_copies():
            self._build_current()
            return
        self.copies = self._copies()
        self.generators = self._generators_for(self.copies)

    def _build_history(self) -> None:
        # k copies of the initial policy; each round recycles the oldest one
        self.history.extend((0, self._copies()) for _ in range(self.trainer.args.comparator_history_k))

    def _build_model(self) -> None:
        a = self.trainer.args
        sources = list(a.comparator_agents) if a.comparator_agents is not None else [a.comparator_model_name] * self.num_agents
        if self.centralized and len(sources) == 1:
            sources = sources * self.num_agents
        if len(sources) != self.num_agents:
            raise ValueError(f"comparator_agents must have one entry per agent ({self.num_agents}) (centralized: 1), got {len(sources)}.")
        kwargs = resolve_model_kwargs(self.trainer._preference_model_config, self.trainer._preference_model_config.get("model_kwargs"))
        models = [m.eval().requires_grad_(False) for m in load_models(sources, kind="comparator_agents", model_kwargs=kwargs, devices=self.devices)]
        tokenizers = []
        for source, policy in zip(sources, self.trainer.policies):
            tokenizers.append(ensure_pad_token(load_tokenizers([source])[0]) if isinstance(source, str) else policy.tokenizer)
        self.models = models
        self.generators = [HFGenerator(m, t, d) for m, t, d in zip(models, tokenizers, self.devices)]

    def _build_api(self) -> None:
        from comlrl.adapters.completion_api import CompletionClient

        self.client = CompletionClient.from_config(self.trainer.args)

    # ------------------------------------------------------------------ round hooks
    def prepare_round(self) -> None:
        """At collection start (and when a run resumes mid-collection): point at this round's policy."""
        if self.policy == "current_copy" and self._separate_copies():
            with torch.no_grad():
                for copy, policy in zip(self.copies, self.trainer.policies):
                    copy.load_state_dict(policy.model.state_dict())
        elif self.policy == "history":
            self.generators = self._generators_for(self.history[0][1])

    def after_collection(self, round_index: int) -> None:
        """History: remember the policy this round started from (``round_index`` rounds complete) in
        place of the oldest copy, which this round has just used."""
        if self.policy != "history":
            return
        _, models = self.history.popleft()
        with torch.no_grad():
            for model, policy in zip(models, self.trainer.policies):
                model.load_state_dict(policy.model.state_dict())
        self.history.append((round_index, models))

    # ------------------------------------------------------------------ candidates
    def candidates(self, target: Sequence[ItemCandidates], count: int, sampling: SamplingParams) -> List[ItemCandidates]:
        """``count`` comparator candidates per item of ``target`` (unscored, on the target's prompts)."""
        if self.centralized:
            return self._centralized(target, count, sampling)
        texts: List[List[List[str]]] = []  # [agent][item][k]
        ids: List[Optional[List[List[torch.Tensor]]]] = []
        for agent in range(self.num_agents):
            prompts = [c.prompts[agent] for c in target]
            if self.client is not None:
                texts.append([self._api(prompt, count, sampling, agent, c.item) for prompt, c in zip(prompts, target)])
                ids.append(None)
                continue
            generator = self.generators[agent]
            out = self._sample(generator, prompts, count, sampling)
            texts.append([out.texts[b * count : (b + 1) * count] for b in range(len(target))])
            same_ids = generator.tokenizer is self.trainer.policies[agent].tokenizer
            ids.append([out.tokens[b * count : (b + 1) * count] for b in range(len(target))] if same_ids else None)
        return [self._side(c, [texts[a][b] for a in range(self.num_agents)], [ids[a][b] if ids[a] is not None else None for a in range(self.num_agents)])
                for b, c in enumerate(target)]

    def _sample(self, generator: HFGenerator, prompts: List[str], count: int, sampling: SamplingParams):
        """Sampled with row seeds drawn from the comparator's own stream (comlrl's sampler draws every
        token from them on any device, so the trainer's global RNG is never touched, on CUDA too)."""
        with self.streams.active(torch.device("cpu")):
            seeds = draw_seeds(len(prompts) * count) if sampling.do_sample else None
        return generator.generate(prompts, count, sampling, seeds=seeds)

    def _api(self, prompt: str, count: int, sampling: SamplingParams, agent: Optional[int], item: Any) -> List[str]:
        completions = self.client.complete(prompt, count, max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                           top_p=sampling.top_p, top_k=sampling.top_k, agent_idx=agent, batch_item=item)
        completions = [c if isinstance(c, str) else str(c) for c in (completions or [])]
        if not completions:
            raise ValueError(f"Comparator API returned no completions for agent {agent} (asked for {count}).")
        return completions[:count]

    def _centralized(self, target: Sequence[ItemCandidates], count: int, sampling: SamplingParams) -> List[ItemCandidates]:
        adapter = self.trainer.centralized_adapter
        prompts = [joint_prompt(adapter, c.item, c.prompts) for c in target]
        if self.client is not None:
            joint = [self._api(prompt, count, sampling, None, c.item) for prompt, c in zip(prompts, target)]
        else:
            out = self._sample(self.generators[self.index], prompts, count, sampling)
            joint = [out.texts[b * count : (b + 1) * count] for b in range(len(target))]
        sides = []
        for c, answers in zip(target, joint):
            parts = [self._split(adapter, text, c.item) for text in answers]
            sides.append(self._side(c, [[p[a] for p in parts] for a in range(self.num_agents)], [None] * self.num_agents))
        return sides

    def _split(self, adapter: Any, text: str, item: Any) -> List[str]:
        parts = split_completion(adapter, text, item, self.num_agents)
        self.unparsed += int(all(p == "" for p in parts) and text.strip() != "")
        return parts

    @staticmethod
    def _side(target: ItemCandidates, texts: List[List[str]], ids: List[Optional[List[torch.Tensor]]]) -> ItemCandidates:
        count = min(len(t) for t in texts)
        texts = [t[:count] for t in texts]
        ids = [i[:count] if i is not None else None for i in ids]
        return ItemCandidates(item=target.item, prompts=target.prompts, prompt_ids=target.prompt_ids, texts=texts, ids=ids)

    # ------------------------------------------------------------------ checkpoints
    def models(self) -> Dict[str, List[nn.Module]]:
        """The comparator's own trained-state models (history copies) for the checkpoint registry."""
        return {f"comparator.history.{j}": models for j, (_, models) in enumerate(self.history)} if self.policy == "history" else {}

    def state_dict(self) -> Dict[str, Any]:
        return {"streams": self.streams.state_dict(), "history_rounds": [label for label, _ in self.history], "unparsed": self.unparsed}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.streams.load_state_dict(state["streams"])
        self.unparsed = int(state["unparsed"])
        labels = list(state["history_rounds"])
        if len(labels) != len(self.history):
            raise ValueError(f"the checkpoint keeps {len(labels)} history policies, this comparator {len(self.history)}.")
        self.history = deque((label, models) for label, (_, models) in zip(labels, self.history))
