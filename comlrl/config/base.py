"""The contract every trainer config follows.

A config is a dataclass with a docstring per field, validated in ``__post_init__`` with errors that
name the field, the value and the fix. Configs remember which fields the caller set explicitly
(``explicit_fields``), so a trainer can tell "left at its default" from "asked for", and they load
from plain dicts (YAML sections) with unknown keys rejected.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, ClassVar, Dict, FrozenSet, Iterable, Mapping, Optional

from comlrl.config.docs import document_class
from comlrl.telemetry.redaction import redact_secrets


class ConfigFieldError(TypeError, ValueError):
    """A config was given a field it does not have (a TypeError like any bad keyword argument, and a
    ValueError like every other config mistake)."""


def unknown_fields_message(cls: type, unknown: Iterable[str], known: Iterable[str], where: str = "") -> str:
    """``Unknown X field(s): 'a' (did you mean 'b'?)`` plus the valid names."""
    known = sorted(known)
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"Unknown {cls.__name__} field(s){where}: {', '.join(hints)}. Valid fields: {', '.join(known)} "
        f"(help({cls.__name__}) or docs/configs.md describes each)."
    )


class ConfigBase:
    """Mixin for trainer config dataclasses (see module docstring).

    Every subclass gets a ``Fields:`` section in its docstring, built from the attribute docstrings
    of its fields (``comlrl.config.docs``), so ``help(MAGRPOConfig)`` describes each field.
    """

    # Fields that may change when a run resumes from a checkpoint (documented in docs/checkpoints.md).
    resumable_fields: ClassVar[FrozenSet[str]] = frozenset()
    # Credentials: never written to checkpoints, logs or configs on disk (``to_dict`` leaves them out).
    secret_fields: ClassVar[FrozenSet[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        document_class(cls)
        # Set before @dataclass runs, which then keeps it instead of writing its own field-by-field repr.
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = ConfigBase._redacted_repr  # type: ignore[method-assign]

    def _redacted_repr(self) -> str:
        """The dataclass repr with every credential masked (``redact_secrets``): a key in a header, a
        URL's password or signed query, so printing or logging a config never shows one."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}  # type: ignore[arg-type]
        body = ", ".join(f"{name}={value!r}" for name, value in redact_secrets(shown).items())
        return f"{type(self).__qualname__}({body})"

    def __new__(cls, *args: Any, **kwargs: Any):
        # Runs before the dataclass __init__, so a misspelt keyword gets a suggestion instead of
        # "__init__() got an unexpected keyword argument".
        known = cls.field_names()
        unknown = [key for key in kwargs if key not in known]
        if unknown:
            raise ConfigFieldError(unknown_fields_message(cls, unknown, known))
        obj = super().__new__(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.init][: len(args)]
        object.__setattr__(obj, "_explicit_fields", frozenset(names) | frozenset(kwargs))
        return obj

    @property
    def explicit_fields(self) -> FrozenSet[str]:
        """Names of the fields given to the constructor (as opposed to left at their defaults)."""
        return getattr(self, "_explicit_fields", frozenset())

    def is_explicit(self, name: str) -> bool:
        return name in self.explicit_fields

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, section: Optional[str] = None):
        """Build a config from a mapping; unknown keys raise a ValueError with close matches."""
        known = cls.field_names()
        unknown = [key for key in values if key not in known]
        if unknown:
            where = f" in section '{section}'" if section else ""
            raise ConfigFieldError(unknown_fields_message(cls, unknown, known, where))
        return cls(**dict(values))

    def to_dict(self) -> Dict[str, Any]:
        """Every field except the ``secret_fields`` (credentials)."""
        return {name: getattr(self, name) for name in self.field_names() if name not in self.secret_fields}

    @classmethod
    def variant(cls, name: str, doc: str, module: str, defaults: Mapping[str, Any]) -> type:
        """A subclass named ``name`` (defined in ``module``) that differs from this config only in the
        ``defaults`` of some of its fields: how an algorithm record's config is made (MAREINFORCEConfig is
        MAGRPOConfig with ``advantage_mode="raw"``)."""
        own = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(defaults) - set(own))
        if unknown:
            raise ConfigFieldError(unknown_fields_message(cls, unknown, own))
        namespace = {"__annotations__": {key: own[key].type for key in defaults}, "__doc__": doc, "__module__": module,
                     "__qualname__": name, **defaults}
        return dataclasses.dataclass(type(name, (cls,), namespace))
