"""Bounded parsing of YAML and JSON files that come from outside (catalogues, profiles, configs).

A file handed to a step by a user can be hostile or broken: a YAML alias bomb ("billion
laughs") expands a few hundred bytes into gigabytes and hangs the parser, a huge or deeply
nested document exhausts memory or the stack. Every such file goes through
:func:`read_document` (or :func:`parse_document` for text already read), which bounds all
three and raises :class:`stepkit.StepError` (exit 2) naming the file:

* size: at most :data:`MAX_BYTES` are read (the file's own size is never trusted);
* nesting depth at most :data:`MAX_DEPTH`, and at most :data:`MAX_NODES` values once YAML
  aliases (``*name``, merge keys) are expanded: an alias counts as everything it names,
  each time it is used, so an alias bomb is refused while it is read, in time linear in
  its text, and what is accepted is safe to walk, copy and validate;
* custom tags are refused (the safe loader's rule).

Cheap to import (PyYAML is imported on first use).
"""

from __future__ import annotations

import json
from typing import Any

from . import storage
from .step import StepError

#: Largest file read (bytes).
MAX_BYTES = 2 * 1024 * 1024
#: Deepest nesting of mappings and lists.
MAX_DEPTH = 50
#: Most nodes (scalars, mappings, lists) in one document.
MAX_NODES = 200_000

_LOADER = None


def _loader():
    """The SafeLoader subclass that bounds nesting and the expanded node count.

    Composing keeps each node's expanded size and height (an alias counts as the whole
    node it names, every time it is used), so a document whose aliases would expand past
    :data:`MAX_NODES` nodes or :data:`MAX_DEPTH` levels is refused while it is composed,
    in time linear in its text; what is accepted can be walked, copied and validated."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream, origin: str = "<document>"):
            super().__init__(stream)
            self.origin, self.depth = origin, 0
            self.sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, height)

        def _line(self) -> int:
            return self.peek_event().start_mark.line + 1

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                line = self._line()
                node = super().compose_node(parent, index)
                size, height = self.sizes.get(id(node), (1, 1))
                if self.depth + height > MAX_DEPTH:
                    raise StepError(f"{self.origin}: line {line}: an alias nests deeper than {MAX_DEPTH} levels")
                return node
            line = self._line()
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise StepError(f"{self.origin}: line {line}: nested deeper than {MAX_DEPTH} levels")
                node = super().compose_node(parent, index)
            finally:
                self.depth -= 1
            if isinstance(node, yaml.MappingNode):
                kids = [n for pair in node.value for n in pair]
            elif isinstance(node, yaml.SequenceNode):
                kids = node.value
            else:
                kids = []
            size, height = 1, 1
            for kid in kids:
                ks, kh = self.sizes.get(id(kid), (1, 1))
                size, height = size + ks, max(height, kh + 1)
            if size > MAX_NODES:
                raise StepError(
                    f"{self.origin}: line {line}: expands to more than {MAX_NODES} values "
                    "(YAML aliases repeating large parts?); refused"
                )
            self.sizes[id(node)] = (size, height)
            return node

    _LOADER = BoundedLoader
    return _LOADER


def _yaml(text: str, origin: str) -> Any:
    import yaml

    loader = _loader()(text, origin)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:  # its message quotes the offending lines: say where, never what
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise StepError(f"{origin}: not valid YAML{where}") from None
    except RecursionError:
        raise StepError(f"{origin}: nested too deeply") from None
    finally:
        loader.dispose()


def _json(text: str, origin: str) -> Any:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StepError(f"{origin}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise StepError(f"{origin}: nested too deeply") from None
    _check_depth(doc, origin)
    return doc


def _check_depth(doc: Any, origin: str) -> None:
    stack, nodes = [(doc, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise StepError(f"{origin}: nested deeper than {MAX_DEPTH} levels")
        if nodes > MAX_NODES:
            raise StepError(f"{origin}: more than {MAX_NODES} values")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def kind_of(name: str) -> str:
    """``json`` for a ``.json`` name, else ``yaml`` (YAML also reads JSON)."""
    return "json" if name.lower().rstrip("/").endswith(".json") else "yaml"


def parse_document(data: bytes | str, origin: str, kind: str | None = None, max_bytes: int = MAX_BYTES) -> Any:
    """The YAML or JSON document in ``data`` (``kind`` ``yaml``/``json``, by default from
    ``origin``'s suffix), bounded as the module says; a :class:`StepError` naming ``origin``."""
    if len(data) > max_bytes:
        raise StepError(f"{origin}: larger than {max_bytes} bytes; refused")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StepError(f"{origin}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    kind = kind or kind_of(origin)
    if kind not in ("yaml", "json"):
        raise ValueError(f"kind must be yaml or json, not {kind!r}")
    return _json(data, origin) if kind == "json" else _yaml(data, origin)


def read_bounded(uri: str, max_bytes: int = MAX_BYTES) -> bytes:
    """At most ``max_bytes`` of ``uri`` (a path or storage URI); a :class:`StepError` naming
    it when it is larger, missing or unreadable."""
    try:
        with storage.open_read(uri) as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise StepError(f"{uri}: no such file") from None
    except IsADirectoryError:
        raise StepError(f"{uri}: a directory, not a file") from None
    except PermissionError as exc:
        raise StepError(f"{uri}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise StepError(f"{uri}: larger than {max_bytes} bytes; refused")
    return data


def read_document(uri: str, kind: str | None = None, max_bytes: int = MAX_BYTES) -> Any:
    """The YAML or JSON document at ``uri`` (a path or storage URI), bounded; see :func:`parse_document`."""
    return parse_document(read_bounded(uri, max_bytes), uri, kind, max_bytes)


def refuse_unknown(doc: dict, known, origin: str, what: str = "key") -> None:
    """A :class:`StepError` naming the first unknown key of ``doc`` (and the known ones)."""
    unknown = sorted(str(k) for k in doc if k not in known)
    if unknown:
        raise StepError(
            f"{origin}: unknown {what} {unknown[0]!r}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + f"; known: {', '.join(sorted(map(str, known)))}"
        )
