"""Command-line flags generated from a config section, so each field's name, type, default and help are
written once. ``max_new_tokens`` is ``--max-new-tokens``, a boolean ``--name`` / ``--no-name``, a list
a repeatable flag, a mapping ``KEY=VALUE``; a section gets no flag; :class:`Flag` (in the field's
``Annotated`` metadata) spells one otherwise. Every command also takes ``--config FILE`` and ``--set``.
"""

from __future__ import annotations

import argparse
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rapo_echo.config.loader import ConfigTree
from rapo_echo.config.overrides import parse_override, set_path
from rapo_echo.config.yaml_files import load_yaml_text
from rapo_echo.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
SECTION = "config_section"  # the parser's default naming its section (read by the reference)
_RESERVED = {"config", "set", "func", "command", "verbose", SECTION}


@dataclass(frozen=True)
class Flag:
    """How a field is spelled on the command line where ``--field-name`` is not it: ``name`` (e.g.
    ``--scorer``), ``off`` (a boolean's flag that sets it false, instead of ``--no-name``), ``sep`` (a
    list given as one text split at it; ``none``: the empty list), ``positional``, ``metavar``."""

    name: str | None = None
    off: str | None = None
    sep: str | None = None
    positional: bool = False
    metavar: str | None = None


def flag_of(info: FieldInfo) -> Flag:
    """The field's :class:`Flag` (its own spelling, else the default one)."""
    for m in info.metadata:
        if isinstance(m, Flag):
            return m
    return Flag()


def flag_name(name: str, info: FieldInfo) -> str:
    """The flag that sets field ``name``: ``--max-new-tokens``, or its :class:`Flag` spelling."""
    spec = flag_of(info)
    if spec.positional:
        return name.upper()
    return spec.name or "--" + name.replace("_", "-")


def flag_names(name: str, info: FieldInfo) -> list[str]:
    """Every flag that sets field ``name``: a boolean's two (``--merge``, ``--no-merge``), else one."""
    flag = flag_name(name, info)
    if _inner(info.annotation) is not bool:
        return [flag]
    return [flag, flag_of(info).off or "--no-" + flag.removeprefix("--")]


def add_flags(
    parser: argparse.ArgumentParser,
    section: type[BaseModel],
    *,
    config: bool = True,
    title: str | None = None,
) -> None:
    """One flag per field of ``section`` (under ``title`` in the help), and with ``config`` ``--config FILE``
    and ``--set KEY=VALUE``; read them back with :func:`section_from_args`."""
    parser.set_defaults(**{SECTION: section})
    if config:
        parser.add_argument(
            "--config", metavar="FILE", help="YAML file of these settings (the keys below; docs/config.md)"
        )
        parser.add_argument(
            "--set", action="append", default=[], metavar="KEY=VALUE", help="set any key (after the flags)"
        )
    group = parser.add_argument_group(title) if title else parser
    for name, info in fields_in_order(section).items():
        if name in _RESERVED:
            raise TypeError(f"{section.__name__}.{name}: the name is taken by the command line")
        if not _sections(info.annotation):
            _add_field(group, name, info)


def fields_in_order(section: type[BaseModel]) -> dict[str, FieldInfo]:
    """The section's fields, its own first, then each base's in the order of its bases (a command's own
    before the settings it inherits)."""
    names = [n for cls in section.__mro__ for n in inspect.get_annotations(cls) if n in section.model_fields]
    return {n: section.model_fields[n] for n in dict.fromkeys([*names, *section.model_fields])}


class _Switch(argparse.Action):
    """A boolean's two flags in one: ``--name`` sets it true, its ``off`` flag (``--no-name``) false."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string == self.option_strings[0])


def _add_field(parser: Any, name: str, info: FieldInfo) -> None:
    spec, flag = flag_of(info), flag_name(name, info)
    text = (info.description or "").replace("%", "%%")
    default = info.get_default(call_default_factory=True)
    if not info.is_required() and default is not False and default not in (None, [], {}, ""):
        text += f" (default: {_shown(default)})"
    inner = _inner(info.annotation)
    kw: dict[str, Any] = {"help": text, "default": argparse.SUPPRESS}
    if inner is bool:
        parser.add_argument(*flag_names(name, info), dest=name, action=_Switch, **kw)
        return
    if spec.positional:
        kw = {"help": text, "nargs": "+" if _is_list(info.annotation) else None}
        parser.add_argument(name, metavar=flag, **kw)
        return
    choices = _literals(inner)
    only = all(typing.get_origin(m) is typing.Literal for m in _members(inner))
    if only and not spec.sep:
        kw["choices"] = [str(c) for c in choices]  # the text given; _convert reads it back
    if (_is_list(info.annotation) and not spec.sep) or typing.get_origin(inner) is dict:
        kw["action"] = "append"
    parser.add_argument(flag, dest=name, metavar=spec.metavar, **kw)


def _shown(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def _inner(annotation: Any) -> Any:
    """The type a flag's text becomes: ``X`` of ``X | None`` and of ``list[X]``."""
    members = _members(annotation)
    one = members[0] if len(members) == 1 else annotation
    if typing.get_origin(one) is typing.Annotated:
        one = typing.get_args(one)[0]
    if typing.get_origin(one) is list:
        return _inner(typing.get_args(one)[0])
    return one


def _is_list(annotation: Any) -> bool:
    return any(typing.get_origin(m) is list for m in _members(annotation))


def _literals(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [v for m in _members(annotation) if m is not annotation for v in _literals(m)]


def _sections(annotation: Any) -> bool:
    return any(isinstance(m, type) and issubclass(m, BaseModel) for m in _members(_inner(annotation)))


def _convert(text: str, annotation: Any) -> Any:
    """A flag's text as the field's type (the first member of a union that reads it): a literal, a whole
    number, a number, else the text."""
    wanted = []
    for member in _members(annotation):
        literals = _literals(member)
        if literals:
            match = [v for v in literals if str(v) == text]
            if match:
                return match[0]
            wanted.append("one of " + ", ".join(map(str, literals)))
        elif member is int or member is float:
            try:
                return member(text)
            except ValueError:
                wanted.append("a whole number" if member is int else "a number")
        else:
            return text
    raise ValueError(f"got {text!r}; expected {' or '.join(wanted)}")


def _mapping(items: list[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` texts (values read as YAML scalars) or ``{...}`` mappings, merged in order."""
    out: dict[str, Any] = {}
    for text in items:
        if text.strip().startswith("{"):
            value = load_yaml_text(text, flag)
            if not isinstance(value, dict):
                raise ConfigError(f"{flag}: expected a mapping such as {{key: value}}, got {text!r}")
            out.update(value)
        elif "=" not in text:
            raise ConfigError(f"{flag}: got {text!r}; expected KEY=VALUE or a mapping such as {{key: value}}")
        else:
            keys, value = parse_override(text)
            out[".".join(keys)] = value
    return out


def _value(raw: Any, info: FieldInfo, flag: str) -> Any:
    spec, inner = flag_of(info), _inner(info.annotation)
    if isinstance(raw, bool):
        return raw
    if typing.get_origin(inner) is dict:
        return _mapping(raw, flag)
    if spec.sep is not None:  # one text, split; ``none`` is the empty list
        raw = [] if raw.strip() == "none" else [part.strip() for part in raw.split(spec.sep) if part.strip()]
    if isinstance(raw, list):
        return [_convert(t, inner) for t in raw]
    return _convert(raw, info.annotation)


def section_from_args(section: type[M], args: argparse.Namespace, *, files: bool = True) -> M:
    """The section the command line gives: ``--config``'s file, under the flags, under ``--set`` (without
    ``files``: the flags alone, where ``--config`` and ``--set`` are another config's)."""
    tree = ConfigTree.read(getattr(args, "config", None) if files else None)
    problems = []
    for name, info in section.model_fields.items():
        if name not in vars(args):
            continue
        flag = flag_name(name, info)
        try:
            value = _value(getattr(args, name), info, flag)
        except ValueError as exc:
            problems.append(f"flag {flag}: {name}: {exc}")
            continue
        set_path(tree.tree, [name], value, flag)
        tree.sources[(name,)] = f"flag {flag}"
    if problems:
        raise ConfigError.invalid(problems)
    tree.apply(overrides=(getattr(args, "set", None) or []) if files else [])
    tree.refuse_nonfinite()
    missing = [
        f"{flag_name(n, i)}: required (or `{n}:` in the --config file)"
        for n, i in section.model_fields.items()
        if i.is_required() and n not in tree.tree
    ]
    if missing:
        raise ConfigError.invalid(missing)
    return tree.validate(section)
