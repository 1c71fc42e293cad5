"""docs/evaluation.md and the README's "Evaluate a trained team": every ``comlrl eval`` command runs
as written, and the Python example runs, on run directories laid out as ``comlrl train`` leaves them
(tiny models in place of the trained agents)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil

import pytest
import yaml

from comlrl.cli.main import main
from tests.helpers.common import REPO_ROOT, length_ratio, prompt_dataset
from tests.helpers.scripted_generation import needs_bwrap


def read(relative):
    with open(os.path.join(REPO_ROOT, relative), encoding="utf-8") as handle:
        return handle.read()


def eval_commands():
    readme = read("README.md")
    section = readme[readme.index("## Evaluate a trained team"):readme.index("## More devices")]
    blocks = re.findall(r"```bash\n(.*?)```", section + read("docs/evaluation.md"), flags=re.S)
    lines = list(dict.fromkeys(line for block in blocks for line in block.splitlines() if line.startswith("comlrl eval ")))
    assert len(lines) == 3  # the README's command is the guide's first
    return [shlex.split(line)[1:] for line in lines]


def run_dir(path, config, agent):
    """A run directory as comlrl train leaves it: its config.yaml and agent_0, agent_1."""
    os.makedirs(path)
    for i in range(2):
        shutil.copytree(agent, os.path.join(path, f"agent_{i}"))
    with open(os.path.join(path, "config.yaml"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)


def bundled(name, **sections):
    from comlrl.runplan.plan import find_config

    data = yaml.safe_load(find_config(name)[0])
    for key, values in sections.items():
        data[key] = {**(data.get(key) or {}), **values}
    return data


@pytest.fixture
def runs(tiny_paths, tmp_path, monkeypatch):
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    monkeypatch.chdir(tmp_path)
    llama = tiny_paths["llama"]
    run_dir("runs/demo-humaneval", bundled("magrpo_he_config.yaml", agent_model={"name": "default", "torch_dtype": "float32"},
                                           magrpo={"max_new_tokens": 8}), llama)
    run_dir("runs/demo-tldr", bundled("magrpo_tldr_config.yaml", agent_model={"name": "default"}, magrpo={"max_new_tokens": 8}), llama)
    # a run with checkpoints: its config.yaml in the run directory its manifest names
    os.makedirs("runs/ckpt-run")
    with open("runs/ckpt-run/config.yaml", "w", encoding="utf-8") as handle:
        yaml.safe_dump({"environment": "tldr", "agents": [llama, llama], "dataset": {"offline": True},
                        "magrpo": {"num_turns": 1, "max_new_tokens": 8}}, handle)
    trainer = MAGRPOTrainer(agents=[llama, llama], reward_func=length_ratio, train_dataset=prompt_dataset(2),
                            args=MAGRPOConfig(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=1, verbose=False,
                                              output_dir="runs/ckpt-run"))
    try:
        trainer.train(checkpoint_dir="runs/ckpts")
    finally:
        trainer.close()
    return tmp_path


@needs_bwrap
@pytest.mark.timeout(600)
def test_documented_eval_commands_run(runs, capsys):
    for argv in eval_commands():
        assert main([*argv, "--quiet"]) == 0, argv
        out = argv[argv.index("--output-dir") + 1]
        record = json.loads((runs / out / "eval.json").read_text())
        assert os.path.getsize(runs / out / "eval.md") and os.path.getsize(runs / out / "eval_rows.jsonl")
        if "--pass-k" in argv:
            assert {"eval/pass@1", "eval/pass@2", "eval/turn_2/pass@1"} <= set(record["metrics"])
            assert record["settings"]["samples_per_item"] == 4 and record["settings"]["num_turns"] == 2
        if "--checkpoint" in argv:
            assert record["settings"]["items"] == 8 and record["models"][0]["checkpoint"].endswith("checkpoint-1")
        if "arxiv" in argv:
            assert record["settings"]["environment"] == "arxiv" and record["settings"]["config"] == "--env arxiv"


@needs_bwrap
@pytest.mark.timeout(600)
def test_the_python_example_runs(runs, capsys):
    block = re.findall(r"```python\n(.*?)```", read("docs/evaluation.md"), flags=re.S)
    assert len(block) == 1
    exec(compile(block[0].replace("max_new_tokens=96", "max_new_tokens=8"), "docs/evaluation.md", "exec"), {"__name__": "docs_example"})
    assert capsys.readouterr().out.strip()
