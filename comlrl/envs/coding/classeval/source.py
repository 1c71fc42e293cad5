"""The class skeleton and the agents' methods, with the rules of OpenMLRL/LLM_Collab_Code_Completion.

The task repository's reward and feedback are defined by these rules, so they are reproduced as it
applies them (its blind spots included, listed in docs/differences.md):

- ``sanitize``: curly quotes, en and em dashes, the ellipsis, no-break and zero-width spaces made
  ASCII (the skeleton, before it is parsed or shown).
- ``class_name_of``: the first ``class Name:`` of the text (a class with bases in parentheses is
  not matched).
- ``incomplete_methods``: the ``def`` methods of that class whose body, after an optional docstring,
  is empty, ``pass``, or ``raise NotImplementedError(...)`` (a call: a bare ``raise
  NotImplementedError`` is not incomplete).
- ``partition``: methods whose signature has exactly one parameter (``self`` counts, ``*args`` and
  ``**kwargs`` count one each) go to agent 0, every other method to agent 1; one agent gets all.
- ``method_snippets``: the text inside the first markdown fence (if any); a method's snippet is its
  ``def`` line up to the next line that starts a ``def`` -- any ``def``, so a nested function ends
  it -- right-stripped and stripped; a later snippet of the same name replaces an earlier one.
- ``select_methods``: each method's snippet from the agent it is assigned to, kept only when it
  parses on its own.
- ``merge``: each selected snippet replaces its method's region in the skeleton (decorators above
  the ``def`` included, up to the next ``def`` at the same indentation: trailing blank lines and the
  next method's decorators go with it), indented to the ``def``; then CRLF and tabs (4 columns) are
  normalised and trailing spaces dropped (the original also runs autopep8, which comlrl does not).

Every function here takes completion text as it came from the policy, so each is total and bounded:
a text longer than ``MAX_TEXT_CHARS`` holds no snippet, regular expressions work line by line, and
the parser is guarded (``PARSE_ERRORS``).
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from comlrl.envs.coding.analysis import MAX_TEXT_CHARS, PARSE_ERRORS

TRANSLATION = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u2013": "-", "\u2014": "-",
                             "\u2026": "...", "\u00a0": " ", "\u200b": None})
CLASS_LINE = re.compile(r"\bclass\s+([A-Za-z_][A-Za-z0-9_]*)\s*:\s*")
SNIPPET_START = re.compile(r"^\s*def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(")
ANY_DEF = re.compile(r"^\s*def\s+[A-Za-z_]")


def sanitize(text: str) -> str:
    """``text`` with the typographic characters the original replaces made ASCII."""
    return text.translate(TRANSLATION) if isinstance(text, str) else text


def class_name_of(skeleton: str) -> Optional[str]:
    """The first ``class Name:`` of the (sanitized) skeleton, or None."""
    match = CLASS_LINE.search(sanitize(skeleton or ""))
    return match.group(1) if match else None


def _class_node(skeleton: str) -> Optional[ast.ClassDef]:
    name = class_name_of(skeleton)
    if not name:
        return None
    try:
        tree = ast.parse(sanitize(skeleton))
    except PARSE_ERRORS:
        return None
    return next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name), None)


def _is_stub(body: List[ast.stmt]) -> bool:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return True
    if len(body) != 1:
        return False
    only = body[0]
    if isinstance(only, ast.Pass):
        return True
    return (isinstance(only, ast.Raise) and isinstance(only.exc, ast.Call) and isinstance(only.exc.func, ast.Name)
            and only.exc.func.id == "NotImplementedError")


def incomplete_methods(skeleton: str) -> List[str]:
    """The methods of the skeleton's class that are left to write, in the skeleton's order."""
    node = _class_node(skeleton)
    if node is None:
        return []
    return [item.name for item in node.body if isinstance(item, ast.FunctionDef) and _is_stub(item.body)]


def param_counts(skeleton: str) -> Dict[str, int]:
    """Method name -> number of parameters in its signature (``self`` included)."""
    node = _class_node(skeleton)
    if node is None:
        return {}
    counts = {}
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = item.args
            counts[item.name] = (len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + (args.vararg is not None)
                                 + (args.kwarg is not None))
    return counts


def partition(skeleton: str, num_agents: int) -> Dict[str, int]:
    """Method -> the agent that writes it: one parameter -> agent 0, others -> agent 1 (one agent: all)."""
    methods = incomplete_methods(skeleton)
    if num_agents <= 1:
        return {name: 0 for name in methods}
    counts = param_counts(skeleton)
    return {name: 0 if counts.get(name) == 1 else 1 for name in methods}


def assigned(parts: Mapping[str, int], agent: int) -> List[str]:
    """The methods ``parts`` gives ``agent``, in the skeleton's order."""
    return [name for name, owner in parts.items() if owner == agent]


def strip_fence(text: str) -> str:
    """The text inside the first markdown fence, if there is one (the whole text otherwise)."""
    text = text.replace("\r\n", "\n").strip()
    start = text.find("```")
    if start == -1:
        return text
    newline = text.find("\n", start + 3)
    if newline == -1:
        return ""
    end = text.find("```", newline + 1)
    return (text[newline + 1:end] if end != -1 else text[newline + 1:]).strip()


def method_snippets(text: Optional[str], allowed: Sequence[str]) -> Dict[str, str]:
    """Method name -> its snippet (``def`` at column 0) for the ``allowed`` names found in ``text``."""
    names = set(allowed)
    if not names or not isinstance(text, str) or not text or len(text) > MAX_TEXT_CHARS:
        return {}
    lines = strip_fence(str.__str__(text)).splitlines()
    out: Dict[str, str] = {}
    i = 0
    while i < len(lines):
        match = SNIPPET_START.match(lines[i])
        if not match or match.group(1) not in names:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not ANY_DEF.match(lines[j]):
            j += 1
        out[match.group(1)] = "\n".join(line.rstrip() for line in lines[i:j]).strip()
        i = j
    return out


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except PARSE_ERRORS:
        return False
    return True


def compiles(code: str) -> bool:
    """Whether ``code`` compiles (the parser and the compiler's own checks: ``nonlocal`` without a
    binding, ``await`` outside ``async def`` ...); nothing runs."""
    try:
        compile(code, "<classeval>", "exec", dont_inherit=True)
    except PARSE_ERRORS:
        return False
    return True


def select_methods(texts: Sequence[str], parts: Mapping[str, int]) -> Dict[str, str]:
    """Method -> the snippet of the agent it is assigned to, for the snippets that parse."""
    selected: Dict[str, str] = {}
    for agent, text in enumerate(texts):
        for name, code in method_snippets(text, assigned(parts, agent)).items():
            if parses(code):
                selected[name] = code
    return selected


def overlapping(texts: Sequence[str], methods: Sequence[str]) -> int:
    """How many methods more than one agent wrote (any incomplete method counts, assigned or not)."""
    written: List[Set[str]] = [set(method_snippets(text, methods)) for text in texts]
    return sum(1 for name in methods if sum(name in names for names in written) > 1)


# ----------------------------------------------------------------------------- merging


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _class_block(lines: List[str], class_name: str) -> Tuple[int, int, int]:
    """(header line, end line (exclusive), body indentation) of the class, or (-1, -1, 0)."""
    header = re.compile(rf"^\s*class\s+{re.escape(class_name)}\s*:")
    start = next((i for i, line in enumerate(lines) if header.match(line)), -1)
    if start == -1:
        return -1, -1, 0
    body = next((_indent(line) for line in lines[start + 1:] if line.strip()), 4)
    end = next((k for k in range(start + 1, len(lines))
                if lines[k].strip() and _indent(lines[k]) < body and not lines[k].lstrip().startswith("@")), len(lines))
    return start, end, body


def _method_region(lines: List[str], start: int, end: int, name: str) -> Tuple[int, int, int]:
    """(first line, end line (exclusive), indentation of the ``def``) of a method, or (-1, -1, 0)."""
    pattern = re.compile(rf"^\s*def\s+{re.escape(name)}\s*\(")
    at = next((i for i in range(start + 1, end) if pattern.match(lines[i])), -1)
    if at == -1:
        return -1, -1, 0
    indent = _indent(lines[at])
    first = at
    while first - 1 > start and lines[first - 1].lstrip().startswith("@"):
        first -= 1
    stop = next((j for j in range(at + 1, end) if ANY_DEF.match(lines[j]) and _indent(lines[j]) == indent), end)
    return first, stop, indent


def merge(skeleton: str, class_name: str, methods: Mapping[str, str]) -> str:
    """The skeleton with each method's region replaced by its snippet (see the module docstring)."""
    if not methods:
        return skeleton
    lines = skeleton.splitlines()
    start, end, _ = _class_block(lines, class_name)
    if start < 0:
        return skeleton
    where = {name: _method_region(lines, start, end, name)[0] for name in methods}
    for name in sorted(methods, key=lambda name: where[name] if where[name] >= 0 else len(lines)):  # in the skeleton's order
        start, end, _ = _class_block(lines, class_name)
        first, stop, indent = _method_region(lines, start, end, name)
        if first < 0:  # every selected method is one of the skeleton's: not reached
            continue
        pad = " " * indent
        lines[first:stop] = [pad + line if line.strip() else line for line in methods[name].strip().splitlines()]
    merged = "\n".join(lines).replace("\r\n", "\n").replace("\r", "\n").expandtabs(4)
    return "\n".join(line.rstrip() for line in merged.splitlines()) + "\n"


# ----------------------------------------------------------------------------- the test module and the entry points


def skeleton_imports(skeleton: str) -> str:
    """The skeleton's top-level import statements (the test module sees them, as in the original's
    one module of code and tests)."""
    try:
        tree = ast.parse(skeleton)
    except PARSE_ERRORS:
        return ""
    return "\n".join(ast.get_source_segment(skeleton, node) or "" for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))


def defined_names(skeleton: str, class_name: str) -> Tuple[str, ...]:
    """The skeleton's top-level classes and functions (the class under test first): the names of
    the candidate's code the tests may use."""
    try:
        tree = ast.parse(skeleton)
    except PARSE_ERRORS:
        return (class_name,) if class_name else ()
    names = [node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return tuple(dict.fromkeys(([class_name] if class_name else []) + names))


def test_ids(test_code: str) -> List[str]:
    """``"TestClass.test_method"`` of every test of the unittest module, in the order unittest's
    loader runs them: classes by name, then their ``test*`` methods (own and inherited from the
    module's other test classes) by name; a class without any runs ``runTest`` if it has one."""
    tree = ast.parse(test_code)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    cases: Dict[str, Set[str]] = {}

    def base_names(node: ast.ClassDef) -> List[str]:
        return [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]

    def methods(name: str, seen: Tuple[str, ...] = ()) -> Optional[Set[str]]:
        """The method names of test class ``name`` (None: not a TestCase)."""
        node = classes.get(name)
        if node is None or name in seen:
            return None
        own = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
        inherited = [methods(base, seen + (name,)) for base in base_names(node) if base in classes]
        if "TestCase" not in base_names(node) and not any(m is not None for m in inherited):
            return None
        return own.union(*[m for m in inherited if m is not None])

    for name in classes:
        found = methods(name)
        if found is not None:
            cases[name] = found
    ids = []
    for name in sorted(cases):
        tests = sorted(m for m in cases[name] if m.startswith("test"))
        ids += [f"{name}.{m}" for m in (tests or (["runTest"] if "runTest" in cases[name] else []))]
    return ids
