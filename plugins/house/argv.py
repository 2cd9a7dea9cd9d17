"""Command lines built from a DAG's form: one flag per param, an empty optional one left out.

A step's argv is rendered item by item (Jinja), so an item cannot vanish by itself: an optional
flag (:func:`optional_flag`) renders to :data:`OMIT` when its field is empty, and both house
operators drop those items once the argv is rendered (:func:`drop_omitted`). The step then sees
the flag missing, as a shell user who did not give it, never an empty argument or a stand-in.
A DAG with a typed form builds its whole command line from it with :func:`param_argv`::

    argv = ["keep-service", *param_argv(FORM), "--out", out]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: What an optional argument (:func:`optional_flag`) renders to when its value is empty: both
#: operators drop it from the rendered argv (:func:`drop_omitted`), so the step never sees it. It
#: stands in the DAG's templates, so it must survive serialization into the metadata database:
#: no NUL (PostgreSQL refuses it in text and JSON), only printable characters. The U+2400
#: SYMBOL FOR NULL brackets make it a value no step flag takes.
OMIT = "\u2400house-omit\u2400"


def optional_flag(flag: str, value: str) -> str:
    """A templated argv item: ``<flag>=<value>`` when the Jinja expression ``value`` (e.g.
    ``"params.model"``) is set, left out of the argv when it is None or "" (a form's empty field).
    The step then sees no flag at all, as a shell user who did not give it, rather than an empty
    value or a stand-in repeated flag."""
    if not flag.startswith("--") or "'" in flag:
        raise ValueError(f"optional_flag: {flag!r} is not a --flag")
    return f"{{{{ ('{flag}=' ~ ({value})) if ({value}) is not none and ({value}) != '' else '{OMIT}' }}}}"


def param_argv(params: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The argv items of a DAG's form, one flag per param (``name`` -> ``--name`` with dashes, in the
    form's order): a param whose JSON type allows null is an :func:`optional_flag`; any other is
    ``--flag`` and its value. ``params``: ``{name: Param keyword arguments}``, the same dict the
    form's ``Param`` objects are built from, so the form and the command line cannot drift."""
    out: list[str] = []
    for name, spec in params.items():
        flag = "--" + name.replace("_", "-")
        types = spec.get("type")
        if "null" in (types if isinstance(types, list) else [types]):
            out.append(optional_flag(flag, f"params.{name}"))
        else:
            out += [flag, f"{{{{ params.{name} }}}}"]
    return out


def drop_omitted(argv: Any) -> Any:
    """A rendered argv without the items :func:`optional_flag` left out (anything else as given)."""
    if isinstance(argv, (list, tuple)):
        return [a for a in argv if a != OMIT]
    return argv
