"""The Markdown reference of a config schema: one section per config class, one row per key with its
type, default, allowed values or range, and description (``rapo-echo config --reference``)."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rapo_echo.config.flags import fields_in_order, flag_names
from rapo_echo.config.messages import models_in


def config_sections(root: type[BaseModel], prefix: str = "") -> dict[type[BaseModel], list[str]]:
    """Every config class under ``root`` (itself at the key path ``prefix``), in order of first
    appearance, with the key paths it sits at."""
    found: dict[type[BaseModel], list[str]] = {root: [prefix]}
    queue = [(root, prefix)]
    while queue:
        model, prefix = queue.pop(0)
        for key, info in model.model_fields.items():
            path = f"{prefix}.{key}" if prefix else key
            for sub in models_in(info.annotation):
                sub_path = f"{path}[]" if typing.get_origin(info.annotation) is list else path
                if sub not in found:
                    found[sub] = []
                    queue.append((sub, sub_path))
                found[sub].append(sub_path)
    return found


def _type_name(annotation: Any) -> str:
    """A short readable name of a field's type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return "str" if all(isinstance(a, str) for a in args) else " | ".join(map(repr, args))
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args]
        if len(models_in(annotation)) > 1:
            return "check"
        return " | ".join(dict.fromkeys("None" if n == "NoneType" else n for n in names))
    if origin is list:
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "section"
        return "None" if annotation is type(None) else annotation.__name__
    return str(annotation)


def _literals(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [v for a in typing.get_args(annotation) for v in _literals(a)]


def _allowed(info: FieldInfo) -> str:
    """Allowed values (literals) and the numeric range of a field."""
    parts = [f"`{v}`" for v in _literals(info.annotation)]
    bounds = []
    for m in info.metadata:
        for cls, sign in ((Ge, ">="), (Gt, ">"), (Le, "<="), (Lt, "<")):
            if isinstance(m, cls):
                bounds.append(f"{sign} {getattr(m, next(iter(m.__dataclass_fields__)))}")
    return ", ".join(parts + ([" and ".join(bounds)] if bounds else []))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "(required)"
    value = info.get_default(call_default_factory=True, validated_data={})
    if value is PydanticUndefined:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(section)"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    if isinstance(value, str) and len(value) > 40:
        text = value[:37] + "..."
    return f"`{text}`" if text != "" else '`""`'


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _section_table(model: type[BaseModel], paths: list[str], command: str | None = None) -> list[str]:
    """A section's table; a ``command``'s names each key's flag too."""
    if command is None:
        where = ", ".join(f"`{p}`" for p in paths if p) or "top level"
        out = [f"## {model.__name__}", "", f"At: {where}.", ""]
    else:
        out = [f"## rapo-echo {command}", ""]
    doc = " ".join((model.__doc__ or "").split()).replace("``", "`")
    if doc:
        out += [doc, ""]
    out += ["| key | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
    for key, info in (fields_in_order(model) if command else model.model_fields).items():
        subs = models_in(info.annotation)
        desc = info.description or ""
        if subs:
            desc += " See " + ", ".join(f"[{m.__name__}](#{_anchor(m)})" for m in subs) + "."
        flags = " / ".join(f"`{f}`" for f in flag_names(key, info))
        name = f"`{key}`" + (f" ({flags})" if command and not subs else "")
        row = [name, _type_name(info.annotation), _default(info), _allowed(info), desc.strip()]
        out.append("| " + " | ".join(_cell(c) for c in row) + " |")
    out.append("")
    return out


def commands_markdown(commands: dict[str, type[BaseModel]]) -> list[str]:
    """The settings of each command but ``train`` (name -> its section): one table each, with flags, then
    the sections nested in it."""
    out = [
        "# Commands",
        "",
        "Every other command reads one section the same way: its flags are generated from it, `--config "
        "FILE` reads its keys from a YAML file and `--set key=value` sets any of them (precedence, lowest "
        "first: the defaults below, the file, the flags, `--set`); errors name the file and line, the flag "
        "or the `--set`.",
        "",
    ]
    listed: set[type[BaseModel]] = set()
    for name, section in commands.items():
        out += _section_table(section, [], command=name)
        for model, paths in list(config_sections(section).items())[1:]:
            if model not in listed:
                listed.add(model)
                out += _section_table(model, paths)
    return out


def reference_markdown(
    root: type[BaseModel],
    algorithms: dict[str, tuple[type[BaseModel] | None, dict[str, Any]]] | None = None,
    commands: dict[str, type[BaseModel]] | None = None,
) -> str:
    """The reference page of ``root`` (the sections every run has), then for each algorithm (name ->
    its own section class or None, its defaults overlay) its section's classes and its defaults, then
    each other command's settings (:func:`commands_markdown`)."""
    sections = config_sections(root)
    out = [
        "# Config reference",
        "",
        "<!-- Generated from the schema by `rapo-echo config --reference --output docs/config.md`; "
        "do not edit by hand. -->",
        "",
        "One YAML file per run; `--set key.path=value` overrides any key. Precedence, lowest first: the "
        "defaults below, the algorithm's defaults (`--algo`, listed at the end), the file, the flags "
        "(`--model`, `--reward`, ...), then `--set`. Unknown keys, wrong types and out-of-range values are "
        "errors naming the file and line. Every run has the sections below; an algorithm with switches of "
        "its own adds its section at its name (`rapo:` for `--algo rapo`), and a run's config holds the "
        "chosen algorithm's section only.",
        "",
    ]
    own: dict[str, list[type[BaseModel]]] = {}  # each algorithm's classes not listed before it
    for name, (section, _) in (algorithms or {}).items():
        own[name] = []
        for model, paths in (config_sections(section, name) if section is not None else {}).items():
            if model not in sections:
                own[name].append(model)
            sections.setdefault(model, [])
            sections[model] += [p for p in paths if p not in sections[model]]
    shared = [m for m in sections if not any(m in models for models in own.values())]
    for model in shared:
        out += _section_table(model, sections[model])
    for name, (_, defaults) in (algorithms or {}).items():
        for model in own[name]:
            out += _section_table(model, sections[model])
        text = yaml.safe_dump(defaults, sort_keys=False, allow_unicode=True, width=100).rstrip()
        out += [f"## Defaults of `--algo {name}`", "", "```yaml", text, "```", ""]
    out += commands_markdown(commands) if commands else []
    return "\n".join(out).rstrip() + "\n"
