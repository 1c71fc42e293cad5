"""Field descriptions of config dataclasses, read from the attribute docstrings in their source.

A config field is documented by the string literal right under it::

    num_generations: int = 4
    \"\"\"K: completions each agent samples per prompt.\"\"\"

Python drops those literals at run time, so ``help()`` would never show them. ``class_fields``
reads them back with ``ast`` when a class is created (``ConfigBase.__init_subclass__``), merged with
the fields its bases documented, and ``fields_section`` renders the ``Fields:`` section that is
appended to the class docstring. ``tools/gen_config_docs.py`` builds ``docs/configs.md`` from the
same records.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

WIDTH = 88


@dataclass(frozen=True)
class FieldDoc:
    name: str
    annotation: str  # as written in the source
    default: str  # repr of the default value ("required" when there is none)
    description: Optional[str]  # the attribute docstring as one paragraph, None when missing


def one_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split())


def _default_repr(cls: type, name: str) -> str:
    if name not in cls.__dict__:
        return "required"
    value = cls.__dict__[name]
    if isinstance(value, dataclasses.Field):
        if value.default is not dataclasses.MISSING:
            return repr(value.default)
        if value.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            return repr(value.default_factory())  # type: ignore[misc]
        return "required"
    return repr(value)


def _class_body(cls: type) -> List[ast.stmt]:
    """The statements of ``cls``'s body, or [] when its source cannot be read (built in a REPL, exec'd)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    node = tree.body[0] if tree.body else None
    return node.body if isinstance(node, ast.ClassDef) else []


def own_fields(cls: type) -> Dict[str, FieldDoc]:
    """The annotated fields written in ``cls``'s own body, in source order, with their docstrings."""
    body = _class_body(cls)
    out: Dict[str, FieldDoc] = {}
    for index, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = ast.unparse(node.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        following = body[index + 1] if index + 1 < len(body) else None
        doc = None
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str):
            doc = one_paragraph(following.value.value)
        name = node.target.id
        out[name] = FieldDoc(name, annotation, _default_repr(cls, name), doc)
    return out


def class_fields(cls: type) -> Dict[str, FieldDoc]:
    """Every documented field of ``cls`` in dataclass order: the bases' fields first (a field
    redefined here keeps its place, takes the new default and keeps the base's description unless
    it has its own), then the new ones."""
    merged: Dict[str, FieldDoc] = {}
    for base in reversed(cls.__mro__[1:]):
        merged.update(base.__dict__.get("_field_docs", {}))
    own = own_fields(cls)
    for name, record in own.items():
        previous = merged.get(name)
        if previous is not None and record.description is None:
            record = dataclasses.replace(record, description=previous.description)
        merged[name] = record
    for name, record in merged.items():  # a default changed without source (``ConfigBase.variant``)
        if name in cls.__dict__ and name not in own:
            merged[name] = dataclasses.replace(record, default=_default_repr(cls, name))
    return merged


def fields_section(fields: Dict[str, FieldDoc]) -> str:
    """``Fields:`` followed by ``name: type = default`` and the wrapped description of each field."""
    lines = ["Fields:"]
    for record in fields.values():
        lines.append(f"    {record.name}: {record.annotation} = {record.default}")
        text = record.description or "(undocumented)"
        lines.extend(textwrap.wrap(text, WIDTH, initial_indent=" " * 8, subsequent_indent=" " * 8))
    return "\n".join(lines)


def document_class(cls: type) -> None:
    """Store ``cls._field_docs`` and append the ``Fields:`` section to its docstring."""
    fields = class_fields(cls)
    cls._field_docs = fields  # type: ignore[attr-defined]
    if not fields:
        return
    own = cls.__dict__.get("__doc__")
    summary = inspect.cleandoc(own) if own else cls.__name__
    cls.__doc__ = f"{summary}\n\n{fields_section(fields)}\n"


def describe(cls: Any) -> Dict[str, FieldDoc]:
    """The field records of a config class (or instance)."""
    cls = cls if isinstance(cls, type) else type(cls)
    return dict(cls.__dict__.get("_field_docs", {}))
