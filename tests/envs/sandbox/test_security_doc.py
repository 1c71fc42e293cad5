"""docs/security.md: every claim names the test that checks it, and every named test exists.

Each bullet of the sections that make claims (how the reward is decided, what the trainer reads,
the isolation, no silent downgrade) must end with ``Tests:`` and references ``file.py::test``
(optionally ``[case]``); each reference must name a test function of that file (under
``tests/envs/sandbox/`` unless a path is given), and each case a name the file spells out.
"""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HERE = os.path.join(ROOT, "tests", "envs", "sandbox")
REFERENCE = re.compile(r"`((?:tests/[\w/]+/)?test_\w+\.py)(?:::(\w+))?((?:\[[^\]]+\])?)`(?:\s+and\s+`\[([^\]]+)\]`)?")
CLAIMING = ("## How the reward is decided", "## What the trainer reads of a completion", "## Isolation: bubblewrap")


def _doc() -> str:
    with open(os.path.join(ROOT, "docs", "security.md"), encoding="utf-8") as handle:
        return handle.read()


def _claims(text: str):
    """(section, bullet text) of every bullet in the claiming sections."""
    for section in CLAIMING:
        body = text[text.index(section):]
        body = body[:body.index("\n## ", 1)] if "\n## " in body[1:] else body
        for bullet in re.split(r"\n- ", body)[1:]:
            yield section, bullet.split("\n\n")[0]


def test_every_claim_names_its_tests():
    claims = list(_claims(_doc()))
    assert len(claims) >= 15
    for section, bullet in claims:
        assert "Tests:" in bullet and REFERENCE.search(bullet[bullet.index("Tests:"):]), (section, bullet[:120])


def test_the_silent_downgrade_paragraph_names_its_tests():
    text = _doc()
    paragraph = text[text.index("### No silent downgrade"):text.index("```bash")]
    assert "Tests:" in paragraph and REFERENCE.search(paragraph)


def test_every_named_test_exists():
    text = _doc()
    functions = {}
    found = 0
    for match in REFERENCE.finditer(text):
        name, function, case, more = match.groups()
        path = os.path.join(ROOT, name) if name.startswith("tests/") else os.path.join(HERE, name)
        assert os.path.exists(path), name
        if name not in functions:
            with open(path, encoding="utf-8") as handle:
                source = handle.read()
            functions[name] = (source, {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)})
        source, defined = functions[name]
        if function:
            assert function in defined, f"{name}::{function} is not a test of {name}"
            found += 1
        for label in filter(None, (case.strip("[]"), more)):
            assert label.rstrip("*_") in source or label.replace("_nohook", "") in source, f"{name}: no case {label!r}"
    assert found >= 40
