"""``key=value`` overrides of a run config, with the syntax of the CoMLRL task repositories.

``parse_override("magrpo.num_turns=1")`` -> ``Override(("magrpo", "num_turns"), "1", 1)``. Values:

- ``true`` / ``false`` (any case) -> bool; ``none`` / ``null`` / ``~`` -> None;
- Python literals: numbers (``5e-6``), quoted strings (``'name'``, ``"name"``), lists, dicts, tuples;
- the same with backslash-escaped quotes, as pasted from the projects' notes where the shell keeps
  the backslashes: ``agents='[\\"Qwen/A\\",\\"Qwen/B\\"]'`` reaches us as ``[\\"Qwen/A\\",\\"Qwen/B\\"]``;
- YAML flow collections with bare words: ``[cuda:0, cuda:1]``;
- anything else is the raw text (``Qwen/Qwen3-1.7B``, ``magrpo_tldr_1.5_1.7``).

The raw text is kept, so a field that must be a string can take ``wandb.name=1.5`` as "1.5".
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Dict, List, MutableMapping, Sequence, Tuple

import yaml

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Override:
    path: Tuple[str, ...]
    raw: str
    value: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)


def parse_value(raw: str) -> Any:
    """A value from its command-line text (see the module docstring)."""
    text = raw.strip()
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null", "~"):
        return None
    candidates = [text]
    if '\\"' in text or "\\'" in text:
        candidates.append(text.replace('\\"', '"').replace("\\'", "'"))
    for candidate in candidates:
        try:
            return ast.literal_eval(candidate)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    for candidate in candidates:
        if candidate[:1] in "[{":
            try:
                parsed = yaml.safe_load(candidate)
            except yaml.YAMLError:
                continue
            if isinstance(parsed, (list, dict)):
                return parsed
    return text


def parse_override(text: str) -> Override:
    """One ``dotted.key=value``; the key must be dotted identifiers."""
    if not isinstance(text, str) or "=" not in text:
        raise ValueError(f"Override {text!r} must look like key=value (e.g. magrpo.num_turns=1).")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not KEY.match(key):
        raise ValueError(f"Override {text!r}: {key!r} is not a dotted key such as agent_model.name or magrpo.num_turns.")
    return Override(tuple(key.split(".")), raw, parse_value(raw))


def parse_overrides(texts: Sequence[str]) -> List[Override]:
    """Every override; a key given twice with different values, or a key and a section holding it
    (``agent_model=...`` and ``agent_model.name=...``), is refused: which one wins would depend on
    their order."""
    parsed = [parse_override(text) for text in texts]
    seen: Dict[Tuple[str, ...], Override] = {}
    for override in parsed:
        for earlier_path, earlier in seen.items():
            shorter = min(len(earlier_path), len(override.path))
            if earlier_path[:shorter] != override.path[:shorter]:
                continue
            if earlier_path == override.path:
                if earlier.raw.strip() == override.raw.strip():
                    continue  # the same value twice: nothing to choose
                raise ValueError(f"--override sets {override.key} twice, to {earlier.raw} and to {override.raw}; only one "
                                 f"can hold (the last would silently win). Keep one of them.")
            section, key = (earlier, override) if len(earlier_path) < len(override.path) else (override, earlier)
            raise ValueError(f"--override sets the section {section.key}={section.raw} and the key {key.key}={key.raw} inside "
                             f"it; which one wins would depend on their order. Set {key.key} alone, or put it in {section.key}'s value.")
        seen[override.path] = override
    return parsed


def apply_overrides(config: MutableMapping[str, Any], overrides: Sequence[Override]) -> Dict[str, Any]:
    """``config`` with every override set (sections are created; a null section becomes a mapping).
    Setting a key inside a list or a scalar is refused, naming both."""
    for override in overrides:
        node = config
        for depth, part in enumerate(override.path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, MutableMapping):
                where = ".".join(override.path[: depth + 1])
                raise ValueError(
                    f"Override {override.key}={override.raw}: {where} is {type(child).__name__} {child!r}, not a section; "
                    f"set {where}=... itself instead."
                )
            node = child
        node[override.path[-1]] = override.value
    return dict(config)


def raw_text_of(overrides: Sequence[Override]) -> Dict[str, str]:
    """``{dotted key: raw text}`` of the last override of each key."""
    return {override.key: override.raw.strip() for override in overrides}


def as_text(value: Any, raw: str) -> str:
    """A string field's value: the override's own text when it parsed as something else."""
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text if not isinstance(value, str) else value

