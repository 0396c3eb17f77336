"""Command-line flags declared once, on the config dataclass field they set.

A field declared ``page_size: int = flag(16, "--page-size", help=...)`` is the whole story of
that setting: its type, default, flag names and help. ``add_flags`` turns the fields of a
dataclass (``PolicyConfig``, ``ServerArgs``) into argparse arguments, so the server's CLI and the
simulator's generate their shared flags from the same definitions; ``from_flags`` builds the
dataclass back from the parsed namespace. Adding a flag is adding one field.

Argument type comes from the annotation: ``int``/``float`` (optionally ``| None``) convert,
``str`` stays text (as does any flag declared ``text=True``, for values such as "N or auto"
that the dataclass parses), ``bool`` is a ``store_true`` switch. A field without a default is a
required flag. Stdlib only: scheduling/ (pure) declares its fields with it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection, Iterable
from typing import Any

_FLAG = "flag"
_TYPES: dict[str, Callable[[str], Any] | None] = {"int": int, "float": float, "str": None, "bool": None}


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    names: tuple[str, ...]  # option strings, the first the canonical one (SGLang's spelling)
    help: str | None = None
    # allowed values, or a function giving them when the parser is built (registries grow
    # when policy plugins load)
    choices: Collection[str] | Callable[[], Collection[str]] | None = None
    text: bool = False  # hand the flag's text to the dataclass (its __post_init__ parses it)


def flag(default: Any = dataclasses.MISSING, *names: str, help: str | None = None,
         choices: Collection[str] | Callable[[], Collection[str]] | None = None,
         text: bool = False, default_factory: Callable[[], Any] | Any = dataclasses.MISSING) -> Any:
    """A dataclass field that is also a command-line flag (``names``: its option strings)."""
    if not names or not all(n.startswith("--") for n in names):
        raise ValueError(f"flag names must start with --, got {names}")
    meta = {_FLAG: FlagSpec(tuple(names), help, choices, text)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_fields(cls: type, exclude: Iterable[str] = ()) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls`` (a dataclass) that carry a flag, in declaration order."""
    skip = set(exclude)
    return [f for f in dataclasses.fields(cls) if _FLAG in f.metadata and f.name not in skip]


def _arg_type(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    base = text.replace(" ", "").replace("|None", "").replace("None|", "")
    if base not in _TYPES:
        raise TypeError(f"flag fields must be int, float, str or bool (optionally | None), got {text!r}")
    return base


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
              exclude: Iterable[str] = ()) -> None:
    """One argparse argument per flag field of ``cls`` (dest = the field's name)."""
    for f in flag_fields(cls, exclude):
        spec: FlagSpec = f.metadata[_FLAG]
        kind = _arg_type(f.type)
        kwargs: dict[str, Any] = {"dest": f.name, "help": spec.help}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        if kind == "bool":
            kwargs["action"] = "store_true"
        elif _TYPES[kind] is not None and not spec.text:
            kwargs["type"] = _TYPES[kind]
        if spec.choices is not None:
            choices = spec.choices() if callable(spec.choices) else spec.choices
            kwargs["choices"] = list(choices)
        parser.add_argument(*spec.names, **kwargs)


def from_flags(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """``cls`` built from the parsed flags of its fields (those present in ``args``) and
    ``overrides`` (settings that come from elsewhere)."""
    kwargs = {f.name: getattr(args, f.name) for f in flag_fields(cls) if hasattr(args, f.name)}
    kwargs.update(overrides)
    return cls(**kwargs)
