"""Config errors a person can act on: one line per problem, naming where the key came from (``file:line``,
a flag or ``--set``), the key, the value given and what is allowed."""

from __future__ import annotations

import difflib
from functools import reduce
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from rapo_echo.config.trl_names import trl_hint

Sources = dict[tuple[str, ...], str]
_TYPE_NAMES = {"str", "list[str]", "int", "float", "bool", "dict[str,any]"}
_MISSING = object()


def where(sources: Sources, key: str | tuple[str, ...]) -> str:
    """``'file:line: '`` (or ``'--set key: '``) for the longest known prefix of ``key``, else ``''``."""
    loc = tuple(key.split(".")) if isinstance(key, str) else key
    for n in range(len(loc), 0, -1):
        if loc[:n] in sources:
            return sources[loc[:n]] + ": "
    return ""


def _describe(err: ErrorDetails) -> str:
    msg = err["msg"]
    ctx = err.get("ctx") or {}
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "literal_error" and "expected" in ctx:
        return f"allowed values are {ctx['expected']}"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return msg


def _real_keys(tree: Any, raw: tuple[str, ...]) -> tuple[str, ...]:
    """The key path of an error location: pydantic adds union members, model names and the tags of
    tagged unions (a list item's ``name``) to it; keep the keys the config really has."""
    loc = [x for x in raw if not x.startswith(("function-", "literal[")) and x not in _TYPE_NAMES]
    keys: list[str] = []
    node = tree
    for part in loc:
        if isinstance(node, dict) and part not in node and part in (node.get("name"), "plugin"):
            continue  # the tag of the union member this item was validated as
        keys.append(part)
        node = _step(node, part)
    return tuple(keys)


def _step(node: Any, part: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return _MISSING


def format_validation_error(exc: ValidationError, sources: Sources, tree: dict, root: type[BaseModel]) -> str:
    """One line per problem: ``where: key: got VALUE; what is allowed``. ``root`` is the model ``tree``
    was validated as (it names the allowed keys of a section, and the new spelling of a renamed key)."""
    out = []
    for err in exc.errors():
        loc = _real_keys(tree, tuple(str(x) for x in err["loc"]))
        key = ".".join(loc)
        value = reduce(_step, loc, tree)
        shown = "(missing)" if value is _MISSING else repr(value)
        hint = _describe(err)
        if err["type"] == "extra_forbidden":
            parent = model_at(root, loc[:-1], tree)
            renamed = getattr(parent, "renamed", {}) if parent is not None else {}
            if loc[-1] in renamed:
                hint = f"no longer a key; write it as {renamed[loc[-1]].format(value=shown)}"
            else:
                given = None if value is _MISSING else value
                run_config = {"train", "rollout"} <= set(root.model_fields)  # TRL names: a run config only
                trl = trl_hint(loc[-1], given, where(sources, loc)) if run_config else None
                meant = trl or did_you_mean(root, loc)
                hint += f"; {meant}" if meant else ""
                if parent is not None:
                    hint += f"; allowed keys here: {', '.join(parent.model_fields)}"
        if not loc:  # a check of the whole section: its own message (the whole tree is no help)
            out.append(hint)
            continue
        out.append(f"{where(sources, loc)}{key}: got {shown}; {hint}")
    return "invalid config:\n  " + "\n  ".join(dict.fromkeys(out))


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config sections an annotation can hold (through unions, lists and ``Annotated``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in getattr(annotation, "__args__", ()) for m in models_in(a)]


def model_at(root: type[BaseModel], loc: tuple[str, ...], tree: Any = None) -> type[BaseModel] | None:
    """The config section at key path ``loc`` under ``root``; where a list holds several kinds of
    section, an item's ``name`` in ``tree`` picks its kind."""
    candidates: list[type[BaseModel]] = [root]
    node = tree
    for part in loc:
        if not part.isdigit():
            field = _member(candidates, node).model_fields.get(part)
            candidates = models_in(field.annotation) if field is not None else []
            if not candidates:
                return None
        node = _step(node, part)
    return _member(candidates, node)


def _member(models: list[type[BaseModel]], node: Any) -> type[BaseModel]:
    """The one of ``models`` whose literal ``name`` is the node's (else the last: the open-ended kind)."""
    name = node.get("name") if isinstance(node, dict) else None
    for m in models:
        field = m.model_fields.get("name")
        if field is not None and name in getattr(field.annotation, "__args__", ()):
            return m
    return models[-1]


def key_paths(root: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the config ``root`` describes (sections and their keys, list items as one)."""
    out: list[str] = []
    for name, field in root.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        for sub in models_in(field.annotation):
            out += [p for p in key_paths(sub, path + ".") if p not in out]
    return out


def did_you_mean(root: type[BaseModel], loc: tuple[str, ...]) -> str | None:
    """``'did you mean KEY?'`` for an unknown key close to one of ``root``'s (same section first)."""
    name, section = loc[-1], ".".join(x for x in loc[:-1] if not x.isdigit())
    paths = key_paths(root)
    leaves: dict[str, list[str]] = {}
    for p in paths:
        leaves.setdefault(p.rsplit(".", 1)[-1], []).append(p)
    near = difflib.get_close_matches(name, leaves, n=1, cutoff=0.75)
    if not near:  # the whole key; not a section it is written in, nor a key whose name is far from it
        written = ".".join(loc)

        def near_leaf(p: str) -> bool:
            return difflib.SequenceMatcher(None, name, p.rsplit(".", 1)[-1]).ratio() >= 0.5

        others = [p for p in paths if not written.startswith(p + ".") and near_leaf(p)]
        near = difflib.get_close_matches(written, others, n=1, cutoff=0.75)
        return f"did you mean {near[0]}?" if near else None
    options = leaves[near[0]]
    same = [p for p in options if p.rsplit(".", 1)[0] == section] if section else []
    if same:
        return f"did you mean {same[0]}?"
    return f"did you mean {' or '.join(options[:3])}?"
