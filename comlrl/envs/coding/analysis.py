"""Static analysis of the two agents' code, with the rules of OpenMLRL/LLM_Collab_Code_Generation.

The original reward and feedback are defined by these rules, so they are reproduced exactly,
including their blind spots (listed in docs/differences.md):

- ``clean_functions``: markdown fences are removed and only ``def`` blocks survive (a block ends at
  the first non-blank line that is not indented deeper than its ``def``, a docstring line at the
  ``def``'s level excepted); capitalised prose lines ending in ``.!?:`` without code characters
  are dropped; no ``def`` left -> "".
- ``extract_function``: the first block named ``name`` in the cleaned text.
- ``defines_with_return``: that block exists and contains ``return`` followed by whitespace.
- ``prompt_imports``: the prompt's ``import`` / ``from ... import`` lines, de-duplicated.
- ``extract_asserts``: the lines of ``def check(candidate):`` that start with ``assert`` plus
  whitespace and mention ``candidate``, de-duplicated, with every ``candidate`` replaced by the
  entry point.
- ``calls_aux``: ``aux(`` occurs as a word.
- ``is_thin_wrapper``: the body (without blank lines, comments, the ``def`` line and docstrings as
  the original tracks them) is empty, one ``return ...aux...`` line, or ``v = aux(...)`` then
  ``return v``. A docstring whose closing quotes stand alone on a line never closes, so everything
  after it counts as docstring (kept; ``ast_is_thin_wrapper`` is the corrected check).
- ``ignored_aux_call``: a line that is exactly ``aux`` + one whitespace + ``(`` + one character +
  ``)``, which almost never occurs, so the -0.5 penalty practically never fires (kept;
  ``ast_ignored_aux_calls`` is the corrected check).

Every function here takes a completion as it came from the policy, so each is total and bounded:
it returns for any ``str`` (NUL bytes, lone surrogates, any Unicode category) in time linear in
its length, and a text longer than ``MAX_TEXT_CHARS`` (far beyond any generation length) defines
nothing (``clean_functions`` returns ""). Python's parser is guarded: code nested too deeply for
it (``RecursionError``, its stack-overflow ``MemoryError``) does not parse. The regular expressions
are linear; the original's wrapper pattern (quadratic on a long run of word characters) is
matched from word starts only, which finds the same match.
"""

from __future__ import annotations

import ast
import functools
import re
from typing import List, Optional, Tuple

DEF_LINE = re.compile(r"^(\s*)def\s+\w+\s*\(")
PROSE_LINE = re.compile(r"^[A-Z][a-z].*[.!?:]$")
CODE_MARKERS = ("def ", "return ", "if ", "for ", "while ", "=", "(", ")", "[", "]")
IMPORT_LINES = (re.compile(r"^from\s+[\w\.]+\s+import\s+.*$"), re.compile(r"^import\s+[\w\.,\s]+$"))
CHECK_BODY = re.compile(r"def check\(candidate\):(.*?)(?=\n\ndef|\Z)", re.DOTALL)
ASSERT_LINE = re.compile(r"assert\s+[^\n]*candidate[^\n]*")
FIRST_PARAMS = re.compile(r"def\s+\w+\s*\(([^)]+)\)")
AUX = "aux"
AUX_ASSIGNMENT = re.compile(rf"(?<!\w)(\w+)\s*=\s*{AUX}\s*\(")
"""The original's ``(\\w+)\\s*=\\s*aux\\s*\\(`` search, anchored at word starts: its leftmost match always
starts there (one starting inside a word also matches from the word's start), so the match is the
same, and a long run of word characters costs linear time instead of quadratic."""
MAX_TEXT_CHARS = 256 * 1024
"""A completion longer than this (in characters) defines nothing: analysis stays bounded."""
PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)
"""What ``ast.parse`` raises for text it cannot take: a syntax error, NUL bytes or lone surrogates
(ValueError), nesting too deep for the parser (RecursionError, MemoryError)."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _inside(line: str, base_indent: int) -> bool:
    return line.startswith(" " * (base_indent + 1)) or line.startswith("\t")


def _function_blocks(lines: List[str]) -> List[str]:
    blocks: List[str] = []
    current: List[str] = []
    base = 0
    i = 0
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        if DEF_LINE.match(line):
            if current:
                blocks.append("\n".join(current))
            current, base = [line], _indent(line)
        elif current:
            if stripped == "" or _inside(line, base):
                current.append(line)
            elif stripped.startswith('"""') or stripped.startswith("'''"):
                current.append(line)
                quote = stripped[:3]
                if not (stripped.endswith(quote) and len(stripped) > 3):
                    i += 1
                    while i < len(lines):
                        current.append(lines[i])
                        if quote in lines[i]:
                            break
                        i += 1
            else:
                blocks.append("\n".join(current))
                current = []
        i += 1
    if current:
        blocks.append("\n".join(current))
    return blocks


def _is_prose(line: str) -> bool:
    stripped = line.strip()
    return (
        bool(stripped)
        and not stripped.startswith(("#", '"""', "'''"))
        and not any(marker in line for marker in CODE_MARKERS)
        and PROSE_LINE.match(stripped) is not None
    )


def clean_functions(text: Optional[str]) -> str:
    """Only the ``def`` blocks of ``text`` (see the module docstring)."""
    if not text or not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return ""
    return _clean_functions(str.__str__(text))


@functools.lru_cache(maxsize=64)
def _clean_functions(text: str) -> str:
    """Cached: the reward and the feedback ask for the same text several times."""
    text = re.sub(r"```python\s*\n?", "", text)
    text = re.sub(r"```\s*\n?", "", text)
    joined = "\n\n".join(_function_blocks(text.split("\n")))
    result = "\n".join(line for line in joined.split("\n") if not _is_prose(line)).strip()
    return result if re.search(r"def\s+\w+\s*\(", result) else ""


def extract_function(text: Optional[str], name: str) -> str:
    """The first ``def name(`` block of the cleaned ``text`` ("" when absent)."""
    if not text or not name:
        return ""
    header = re.compile(rf"^(\s*)def\s+{re.escape(name)}\s*\(")
    lines: List[str] = []
    base = 0
    for line in clean_functions(text).split("\n"):
        if header.match(line):
            lines, base = [line], _indent(line)
        elif lines:
            if line.strip() == "" or _inside(line, base):
                lines.append(line)
            else:
                break
    return "\n".join(lines).strip()


def defines_with_return(text: Optional[str], name: str, label: str) -> Tuple[bool, str]:
    """(found with a ``return``, message) for the function ``name`` in ``text``."""
    function = extract_function(text, name)
    if not function:
        return False, f"{label} not defined"
    if re.search(r"return\s+", function) is None:
        return False, f"{label} missing return statement"
    return True, f"{label} properly defined with return statement"


def prompt_imports(prompt: Optional[str]) -> str:
    """The prompt's import lines (stripped, de-duplicated, in order), joined by newlines."""
    found: List[str] = []
    for line in (prompt or "").split("\n"):
        line = line.strip()
        if any(pattern.match(line) for pattern in IMPORT_LINES) and line not in found:
            found.append(line)
    return "\n".join(found)


def combine(aux_function: str, main_function: str, imports: str) -> str:
    """Imports, the cleaned aux and the cleaned main, separated by blank lines."""
    parts = [imports] if imports else []
    parts += [code for code in (clean_functions(aux_function), clean_functions(main_function)) if code]
    return "\n\n".join(parts)


@functools.lru_cache(maxsize=16)
def parse(code: str) -> Tuple[Optional[ast.Module], Optional[Tuple[Optional[int], Optional[int], str]]]:
    """(tree, None), or (None, (line, column, message)) for code Python's parser does not take
    (``PARSE_ERRORS``: too deeply nested code is one). Cached: callers only read the tree."""
    try:
        return ast.parse(code), None
    except SyntaxError as error:
        return None, (error.lineno, error.offset, str(error.msg))
    except PARSE_ERRORS as error:
        reason = str(error) if isinstance(error, ValueError) else "the code is nested too deeply to parse"
        return None, (None, None, reason or type(error).__name__)


def syntax_error(code: str) -> Optional[Tuple[Optional[int], Optional[int], str]]:
    """None when ``code`` parses, else (line, column, message)."""
    return parse(code)[1]


def extract_asserts(test_code: Optional[str], entry_point: Optional[str]) -> List[str]:
    """The asserts of ``check(candidate)`` that the original reward runs (see the module docstring)."""
    if not test_code or not entry_point:
        return []
    body = CHECK_BODY.search(test_code)
    if body is None:
        return []
    found: List[str] = []
    for line in body.group(1).strip().split("\n"):
        line = line.strip()
        if line.startswith("assert") and "candidate" in line and ASSERT_LINE.match(line) and line not in found:
            found.append(line)
    return [line.replace("candidate", entry_point) for line in found]


def sliced_test_code(test_code: str, count: Optional[int]) -> str:
    """The test code with only the first ``count`` (negative: last ``-count``; 0/None: all) asserts
    of ``check`` kept, as the original feedback builds its "sandbox" tests."""
    if not isinstance(test_code, str) or not test_code.strip() or not count:
        return test_code
    lines = test_code.splitlines()
    check = next((i for i, line in enumerate(lines) if re.match(r"\s*def\s+check\s*\(candidate\)\s*:\s*", line)), None)
    preamble = "\n".join(lines[:check] if check is not None else lines).strip()
    start = check + 1 if check is not None else 0
    asserts = [line.strip() for line in lines[start:] if line.strip().startswith("assert") and "candidate" in line]
    if not asserts:
        return test_code
    chosen = asserts[:count] if count > 0 else asserts[count:]
    parts = ([preamble] if preamble else []) + ["def check(candidate):"] + [f"    {line}" for line in chosen]
    return "\n".join(parts) + "\n"


def signature_params(prompt: str, entry_point: str) -> List[str]:
    """Parameters of ``entry_point`` in the prompt (else of its first ``def``), as written."""
    own = re.search(rf"def\s+{re.escape(entry_point)}\s*\(([^)]*)\)", prompt or "") if entry_point else None
    match = own or FIRST_PARAMS.search(prompt or "")
    return [p.strip() for p in match.group(1).split(",") if p.strip()] if match else []


# ----------------------------------------------------------------------------- collaboration checks


def calls_aux(main_function: str) -> bool:
    return bool(main_function) and re.search(rf"\b{AUX}\s*\(", main_function) is not None


def is_thin_wrapper(main_function: str) -> bool:
    """The original check (see the module docstring)."""
    if not main_function:
        return False
    body: List[str] = []
    in_docstring = False
    for line in main_function.split("\n"):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith('"""') or stripped.startswith("'''"):
            quote = stripped[:3]
            if not (stripped.endswith(quote) and len(stripped) > 3):
                in_docstring = True
            continue
        if in_docstring:
            if '"""' in stripped or "'''" in stripped:
                in_docstring = False
            continue
        if stripped.startswith("#") or stripped.startswith("def "):
            continue
        body.append(stripped)
    if not body:
        return True
    if len(body) == 1:
        return body[0].startswith("return ") and AUX in body[0]
    if len(body) == 2:
        assigned = AUX_ASSIGNMENT.search(body[0])
        return bool(assigned) and body[1] == f"return {assigned.group(1)}"
    return False


def ignored_aux_call(main_function: str) -> bool:
    """The original penalty's test (see the module docstring)."""
    if not main_function or AUX not in main_function:
        return False
    return any(
        re.fullmatch(rf"{AUX}\s\([^)]\)", line.strip()) for line in main_function.split("\n")
        if line.strip() and not line.strip().startswith("#")
    )


def _function_body(main_function: str) -> Optional[List[ast.stmt]]:
    tree = parse(main_function)[0]
    if tree is None:
        return None
    functions = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return functions[0].body if functions else None


def ast_is_thin_wrapper(main_function: str) -> bool:
    """Corrected wrapper check: the body (docstring dropped) is ``return aux(...)`` or
    ``v = aux(...)`` then ``return v``."""
    body = _function_body(main_function)
    if body is None:
        return is_thin_wrapper(main_function)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return True

    def is_aux_call(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == AUX

    if len(body) == 1:
        return isinstance(body[0], ast.Return) and body[0].value is not None and is_aux_call(body[0].value)
    if len(body) == 2 and isinstance(body[0], ast.Assign) and is_aux_call(body[0].value):
        target = body[0].targets[0]
        returned = body[1].value if isinstance(body[1], ast.Return) else None
        return isinstance(target, ast.Name) and isinstance(returned, ast.Name) and returned.id == target.id
    return False


def ast_ignored_aux_calls(main_function: str) -> List[str]:
    """Calls of ``aux`` whose result is thrown away: a bare ``aux(...)`` statement, or a name
    assigned from ``aux(...)`` that is never read afterwards (``"Line N: reason"`` each)."""
    tree = parse(main_function or "")[0]
    if tree is None:
        return []
    last_read = {}  # name -> the last line that reads it
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            last_read[node.id] = max(node.lineno, last_read.get(node.id, 0))
    problems = []
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == AUX):
            continue
        if isinstance(node, ast.Expr):
            problems.append(f"Line {node.lineno}: result of aux(...) is discarded")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and last_read.get(target.id, 0) <= node.lineno:
                    problems.append(f"Line {node.lineno}: aux(...) is assigned to {target.id} but {target.id} is never used")
    return sorted(problems)
