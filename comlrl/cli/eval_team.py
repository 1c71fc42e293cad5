"""The team ``comlrl eval`` evaluates: saved agent folders or a training checkpoint, and every check
that can refuse it before a model loads.

- ``--agents DIR [DIR ...]``: the ``agent_i`` folders ``save_model`` writes (or their parent, which
  stands for ``agent_0, agent_1, ...``). Folders named ``agent_<i>`` must be given in that order; the
  run config ``comlrl train`` wrote beside them (``config.yaml``) is the evaluation's default config
  and says how large the team it trained was.
- ``--checkpoint DIR``: a checkpoint folder (or a checkpoint directory: its latest). Its manifest says
  which trainer wrote it, its agents and their tokenizers; the models' architectures come from the
  run config (``--config``, or the ``config.yaml`` of the run directory the manifest names). The
  agents' weights are read from the checkpoint after the team is built from those sources
  (``load_checkpoint_agents``); nothing else of the checkpoint is loaded.
- Tokenizers must fit their models: no token id past the embedding (``config.json``'s
  ``vocab_size``), and a checkpoint's agents get exactly the tokenizers it was trained with (its
  manifest's fingerprints).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

RUN_CONFIG = "config.yaml"  # comlrl train's repeatable config of a run, in its run directory
AGENT_FOLDER = re.compile(r"^agent_(\d+)$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


@dataclass
class TeamSource:
    """Where the evaluated agents come from (see the module docstring)."""

    folders: Optional[List[str]] = None
    checkpoint: Optional[str] = None
    manifest: Optional[Dict[str, Any]] = None
    saved_config: Optional[str] = None

    @property
    def size(self) -> Optional[int]:
        if self.folders is not None:
            return len(self.folders)
        return len(checkpoint_agents(self.manifest))


# ----------------------------------------------------------------------------- saved agent folders


def expand_agents(given: Sequence[str]) -> List[str]:
    """The agent folders of ``--agents``: one folder holding ``agent_0`` stands for its ``agent_i``
    folders; every folder must hold a saved model."""
    if len(given) == 1 and os.path.isdir(os.path.join(given[0], "agent_0")):
        parent = given[0]
        found = sorted((int(m.group(1)), name) for name in os.listdir(parent) if (m := AGENT_FOLDER.match(name)))
        folders = [os.path.join(parent, name) for number, name in found]
        if [number for number, _ in found] != list(range(len(found))):
            raise ValueError(f"--agents {parent!r} holds the agent folders {[n for _, n in found]}, not agent_0 .. agent_{len(found) - 1} "
                             f"without gaps; give the agent folders one by one.")
        given = folders
    for folder in given:
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--agents {folder!r} is not a folder; give the agent folders save_model wrote (agent_0, "
                                    f"agent_1, ...) or the folder that holds them.")
        if not any(os.path.isfile(os.path.join(folder, name)) for name in ("config.json", "adapter_config.json")):
            raise ValueError(f"--agents {folder!r} holds no saved model (no config.json or adapter_config.json); give the "
                             f"agent folders save_model wrote (agent_0, agent_1, ...).")
    return [os.path.normpath(folder) for folder in given]


def check_order(folders: Sequence[str], saved_config: Optional[str]) -> None:
    """Folders named ``agent_<i>`` sit in slot i: a team given out of order would give each agent the
    other's role (its prompts and its part of the reward)."""
    for slot, folder in enumerate(folders):
        match = AGENT_FOLDER.match(os.path.basename(os.path.normpath(folder)))
        if match is None or int(match.group(1)) == slot:
            continue
        trained = f" (its run config {saved_config} trained it as agent {match.group(1)})" if saved_config else ""
        order = " ".join(sorted(folders, key=lambda f: os.path.basename(os.path.normpath(f))))
        raise ValueError(f"--agents: {folder!r} is given as agent {slot}, but it is agent {match.group(1)} of its team{trained}; each "
                         f"agent keeps the role it was trained in. Give the folders in their order: --agents {order}")


def saved_config_of(folders: Sequence[str]) -> Optional[str]:
    """``config.yaml`` of the run directory that holds every ``agent_<i>`` folder (``comlrl train``
    saves the agents into the run directory by default), else None."""
    parents = {os.path.dirname(os.path.abspath(folder)) for folder in folders}
    if len(parents) != 1 or not all(AGENT_FOLDER.match(os.path.basename(os.path.normpath(f))) for f in folders):
        return None
    path = os.path.join(parents.pop(), RUN_CONFIG)
    return path if os.path.isfile(path) else None


def trained_team_size(data: Any) -> Optional[int]:
    """The team size a run config trained (its ``agents`` list, else its sections' ``num_agents``)."""
    from comlrl.runplan.plan import choose_algorithm

    if not isinstance(data, dict):
        return None
    if isinstance(data.get("agents"), list):
        return len(data["agents"])
    try:
        algorithm, section = choose_algorithm(data, None)
    except ValueError:
        return None
    if algorithm.agents is not None:
        return algorithm.agents
    values = data.get(section) or {}
    count = values.get("num_agents") if isinstance(values, dict) else None
    return count if isinstance(count, int) else algorithm.config_class()().num_agents


# ----------------------------------------------------------------------------- checkpoints


def read_checkpoint(path: str) -> Dict[str, Any]:
    """The manifest of ``--checkpoint`` (a folder, its manifest, or a directory: its latest), checked
    for what an evaluation reads. Nothing but JSON is read."""
    from comlrl.checkpoint import layout
    from comlrl.checkpoint.files import CheckpointError

    try:
        folder = layout.resolve_checkpoint(path)
        manifest = layout.read_manifest(folder)
        layout.check_restorable(manifest, folder)
    except (OSError, CheckpointError) as error:
        raise ValueError(f"--checkpoint {path!r}: {error}") from None
    manifest["path"] = folder
    if not checkpoint_agents(manifest):
        raise ValueError(f"--checkpoint {folder!r} holds no agents (models agents.0, agents.1, ...); give a training checkpoint.")
    if "lora_bases" in manifest["states"]:
        raise ValueError(f"--checkpoint {folder!r} holds LoRA adapters without their frozen bases; export the agents with "
                         f"trainer.save_model(dir) (merge_adapters=True for full models) and evaluate them with --agents dir.")
    return manifest


def checkpoint_agents(manifest: Optional[Dict[str, Any]]) -> List[str]:
    names = [name for name in (manifest or {}).get("models", {}) if re.fullmatch(r"agents\.\d+", name)]
    return sorted(names, key=lambda name: int(name.split(".")[1]))


def checkpoint_run_config(manifest: Dict[str, Any]) -> Optional[str]:
    """``config.yaml`` of the run that wrote the checkpoint: in the run directory its config names
    (``output_dir``), or beside the checkpoint or its directory."""
    folder = manifest["path"]
    output_dir = ((manifest.get("config") or {}).get("fields") or {}).get("output_dir")
    candidates = ([output_dir] if isinstance(output_dir, str) else []) + [os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))]
    for candidate in candidates:
        path = os.path.join(candidate, RUN_CONFIG)
        if candidate and os.path.isfile(path):
            return path
    return None


def check_checkpoint_family(manifest: Dict[str, Any], algorithm: Any, asked: str) -> None:
    """The checkpoint's trainer must be of the family of the algorithm asked for (``asked`` names where
    that came from)."""
    from comlrl.trainers.registry import ALGORITHMS

    saved = manifest["trainer_class"].rsplit(".", 1)[-1]
    writers = [record for record in ALGORITHMS.values() if record.trainer_name == saved]
    if not writers:
        raise ValueError(f"--checkpoint {manifest['path']!r} was written by {saved}, which no registered algorithm trains; --import "
                         f"the module that registers it.")
    if algorithm.family not in {record.family for record in writers}:
        raise ValueError(f"--checkpoint {manifest['path']!r} is a checkpoint of {saved} ({writers[0].family} family), but {asked} asks "
                         f"for {algorithm.name} ({algorithm.family} family); give --algorithm {writers[0].name} or the config of the "
                         f"run that wrote it.")


def load_checkpoint_agents(manifest: Dict[str, Any], agents: Sequence[Any]) -> None:
    """Copy the checkpoint's agent weights into ``agents`` (built from the run's sources), after
    checking each model's tensors against its index and its files against their SHA-256 records."""
    from comlrl.checkpoint.files import MODEL_INDEX_FILENAME, check_shard_headers, load_module, module_differences, read_json, verify_files
    from comlrl.checkpoint.folder import inside

    folder = manifest["path"]
    for name, agent in zip(checkpoint_agents(manifest), agents):
        model_folder = inside(folder, manifest["models"][name]["folder"])
        prefix = manifest["models"][name]["folder"].rstrip("/") + "/"
        verify_files(folder, {path: record for path, record in manifest["files"].items() if path.startswith(prefix)})
        index = read_json(os.path.join(model_folder, MODEL_INDEX_FILENAME), "Model index")
        diffs = module_differences(index, agent)
        if diffs:
            raise ValueError(f"--checkpoint {folder!r}: agent {name.split('.')[1]} built from the run config differs from the "
                             f"checkpoint's ({'; '.join(diffs)}); give the config of the run that wrote it (--config).")
        check_shard_headers(model_folder, index)
        load_module(model_folder, index, agent)
        agent.eval()


# ----------------------------------------------------------------------------- tokenizers


def check_tokenizers(sources: Sequence[str], tokenizers: Sequence[Any], argument: str) -> None:
    """No tokenizer may produce an id past its model's embedding (``vocab_size`` of its config)."""
    from transformers import AutoConfig

    for slot, (source, tokenizer) in enumerate(zip(sources, tokenizers)):
        try:
            config = AutoConfig.from_pretrained(config_source(source))
        except (OSError, ValueError) as error:
            raise ValueError(f"{argument}: could not read the model config of agent {slot} ({source!r}): {error}") from None
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        vocab = getattr(text, "vocab_size", None)
        if isinstance(vocab, int) and len(tokenizer) > vocab:
            raise ValueError(f"{argument}: agent {slot}'s tokenizer ({source}) has {len(tokenizer)} tokens but its model's embedding has "
                             f"{vocab} rows (vocab_size); ids from {vocab} on would index past it. The tokenizer is not this model's: "
                             f"put the tokenizer the model was trained with beside it (save_model writes both).")


def config_source(source: str) -> str:
    """Where a model's config is: the folder itself, or for a LoRA adapter folder (``save_model`` of a
    LoRA agent) the base model its ``adapter_config.json`` names."""
    import json

    adapter = os.path.join(source, "adapter_config.json")
    if os.path.isdir(source) and not os.path.isfile(os.path.join(source, "config.json")) and os.path.isfile(adapter):
        with open(adapter, encoding="utf-8") as handle:
            base = json.load(handle).get("base_model_name_or_path")
        if isinstance(base, str) and base:
            return base
    return source


def check_checkpoint_tokenizers(manifest: Dict[str, Any], tokenizers: Sequence[Any], sources: Sequence[str]) -> None:
    """The tokenizers the team will use must be those the checkpoint's run trained with."""
    from comlrl.checkpoint.state import tokenizer_fingerprint

    saved = manifest.get("tokenizers") or {}
    for slot, (tokenizer, source) in enumerate(zip(tokenizers, sources)):
        record = saved.get(f"agents.{slot}")
        if record is not None and tokenizer_fingerprint(tokenizer) != record:
            raise ValueError(f"--checkpoint {manifest['path']!r}: agent {slot}'s tokenizer from {source!r} is not the one the "
                             f"checkpoint was trained with (its fingerprint differs); give the config of the run that wrote it "
                             f"(--config), whose model sources carry that tokenizer.")


# ----------------------------------------------------------------------------- what eval.json says of the models


def describe_team(team: TeamSource, sources: Sequence[str]) -> List[Dict[str, Any]]:
    """Per agent: where it came from and the size and SHA-256 of its weight files."""
    from comlrl.checkpoint.files import file_record

    out = []
    if team.folders is not None:
        for slot, folder in enumerate(team.folders):
            names = sorted(n for n in os.listdir(folder) if n.endswith(WEIGHT_SUFFIXES) and os.path.isfile(os.path.join(folder, n)))
            out.append({"agent": slot, "source": os.path.abspath(folder), "files": {n: file_record(os.path.join(folder, n)) for n in names}})
        return out
    manifest = team.manifest
    for slot, name in enumerate(checkpoint_agents(manifest)):
        prefix = manifest["models"][name]["folder"].rstrip("/") + "/"
        out.append({
            "agent": slot, "source": sources[slot], "checkpoint": os.path.abspath(manifest["path"]), "model": name,
            "trainer_class": manifest["trainer_class"], "run_id": manifest["run_id"], "sequence": manifest["sequence"],
            "progress": manifest.get("progress"),
            "files": {path[len(prefix):]: record for path, record in manifest["files"].items() if path.startswith(prefix)},
        })
    return out

