"""Write docs/configs.md: every trainer config class, with each field's type, default and description.

    python tools/gen_config_docs.py          # rewrite docs/configs.md
    python tools/gen_config_docs.py --check  # exit 1 when docs/configs.md is not current

The descriptions are the attribute docstrings of the fields (``comlrl.trainers.field_docs``); the
test suite regenerates the page and compares it with the committed file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(ROOT, "docs", "configs.md")

HEADER = """# Config reference

Every field of every trainer config, with its type, default and description. Generated from the
field docstrings by `tools/gen_config_docs.py`; do not edit by hand (a test checks that this page is
current). In Python, `help(MAGRPOConfig)` shows the same descriptions.

Configs are dataclasses: `MAGRPOConfig(num_turns=1, num_generations=4, ...)`; an unknown or misspelt field is an
error that suggests the closest name. Invalid values raise a `ValueError` naming the field when the
config is created.
"""


def config_classes() -> List[type]:
    """The public ``*Config`` classes of every module under ``comlrl.trainers``, by module then name."""
    import comlrl.trainers
    from comlrl.trainers.config_base import ConfigBase

    for module in pkgutil.walk_packages(comlrl.trainers.__path__, "comlrl.trainers."):
        importlib.import_module(module.name)
    found, stack = {}, list(ConfigBase.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith("comlrl.") and cls.__name__.endswith("Config") and not cls.__name__.startswith("_"):
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[key] for key in sorted(found)]


def public_module(cls: type) -> str:
    """The package users import ``cls`` from (``comlrl.trainers.reinforce`` rather than its config module)."""
    parts = cls.__module__.split(".")
    for end in range(2, len(parts) + 1):
        module = importlib.import_module(".".join(parts[:end]))
        if getattr(module, cls.__name__, None) is cls and end > 2:
            return module.__name__
    return cls.__module__


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    from comlrl.trainers.field_docs import describe

    out = [HEADER]
    classes = config_classes()
    out.append("| config | import |\n|---|---|")
    for cls in classes:
        out.append(f"| [`{cls.__name__}`](#{cls.__name__.lower()}) | `from {public_module(cls)} import {cls.__name__}` |")
    for cls in classes:
        summary = (cls.__doc__ or "").split("\n\nFields:")[0].strip()
        out.append(f"\n## {cls.__name__}\n\n{summary}\n")
        out.append("| field | type | default | description |\n|---|---|---|---|")
        for record in describe(cls).values():
            description = record.description or "(undocumented)"
            out.append(f"| `{record.name}` | `{cell(record.annotation)}` | `{cell(record.default)}` | {cell(description)} |")
    return "\n".join(out) + "\n"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/configs.md from the config field docstrings.")
    parser.add_argument("--check", action="store_true", help="only check that docs/configs.md is current")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        with open(OUTPUT, encoding="utf-8") as handle:
            current = handle.read() == text
        if not current:
            print(f"{OUTPUT} is out of date; run python tools/gen_config_docs.py", file=sys.stderr)
        return 0 if current else 1
    with open(OUTPUT, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(OUTPUT)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
