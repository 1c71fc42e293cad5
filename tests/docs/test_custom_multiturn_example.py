"""docs/environments.md's multi-turn custom task runs as written, with a tiny chat model substituted
for the embedded one."""

from __future__ import annotations

import os
import re
from tests.helpers.common import REPO_ROOT, no_signal_expected

ROOT = REPO_ROOT
MODEL_LINE = "MODEL = default_model_dir()"


def example() -> str:
    with open(os.path.join(ROOT, "docs", "environments.md"), encoding="utf-8") as handle:
        text = handle.read()
    section = text[text.index("## Your own task over several turns"):]
    section = section[: section.index("\n## ", 4)]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


# tiny random models: all answers of a step may score alike, and the trainer says so
@no_signal_expected
def test_the_multi_turn_example_trains_two_turns(chat_models, tmp_path, monkeypatch):
    code = example()
    assert MODEL_LINE in code and "num_turns=2" in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "environments_md_example"}
    exec(compile(code.replace(MODEL_LINE, f"MODEL = {chat_models['llama']!r}"), "docs/environments.md", "exec"), scope)
    trainer = scope["trainer"]
    assert trainer.args.num_turns == 2
    assert any("turn_2/reward_mean" in row for row in trainer.log_history)
    assert os.path.getsize(tmp_path / "runs" / "two-turns" / "metrics.jsonl") > 0
