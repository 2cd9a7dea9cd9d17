"""Trigger-form params from a typed configuration (a dataclass). Stdlib only, no Airflow.

Each field of the dataclass is declared with :func:`param` (its default, its JSON type, a
title, a description in the user's words, and JSON-schema keywords such as ``minimum`` or
``enum``); :func:`class_params` turns the class into ``{name: Param kwargs}`` in the class's
order, for a DAG file to build ``Param(**kwargs)`` from. The form and the configuration are
then one declaration: a field added, renamed or given another default moves the form with it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

_KEY = "form"
_TYPES = {"string", "integer", "number", "boolean", "array", "object"}


def param(default: Any, type: str, title: str, description: str, nullable: bool = False, **schema: Any) -> Any:
    """A dataclass field shown in a trigger form: ``type`` the JSON type of its value,
    ``nullable`` when an empty field (None) has a meaning (say which in ``description``),
    ``schema`` further JSON-schema keywords."""
    if type not in _TYPES:
        raise ValueError(f"unknown JSON type {type!r}; known: {', '.join(sorted(_TYPES))}")
    spec = {"type": ["null", type] if nullable else type, "title": title, "description": description, **schema}
    if isinstance(default, (list, dict)):
        frozen = json.dumps(default)
        return dataclasses.field(default_factory=lambda: json.loads(frozen), metadata={_KEY: spec})
    return dataclasses.field(default=default, metadata={_KEY: spec})


def _types(spec: Mapping[str, Any]) -> list[str]:
    t = spec.get("type")
    return list(t) if isinstance(t, list) else [t]


def class_params(
    cls: type, defaults: Mapping[str, Any] | None = None, choices: Mapping[str, Sequence[Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """``{name: Param kwargs}`` of every field of ``cls`` declared with :func:`param`, in the
    class's order: its declared default (or ``defaults``'s), JSON type, title, description and
    schema keywords (``choices``: an ``enum`` known only where the form is built; an array's
    goes to its items)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    out: dict[str, dict[str, Any]] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_KEY)
        if spec is None:
            raise ValueError(f"{cls.__name__}.{f.name} is not declared with stepkit.forms.param")
        if f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = f.default_factory()  # type: ignore[misc]
        kwargs = {"default": (defaults or {}).get(f.name, default), **json.loads(json.dumps(spec))}
        if choices and f.name in choices:  # an array's choices are its items'
            target = kwargs.setdefault("items", {}) if "array" in _types(kwargs) else kwargs
            target["enum"] = list(choices[f.name])
        out[f.name] = kwargs
    return out
