"""What a step may read when it runs for a form: inputs are data, not reach.

A DAG param (a trace, a log description, a model or sample output, a profile or simulator
configuration) becomes a path or URI a step opens. The worker (or the pod) that opens it holds
the storage credentials and sits inside the cluster network, and anyone allowed to trigger a DAG
fills in its form, so a param naming ``/etc/shadow``, ``/proc/self/environ`` or an internal
``http://`` URL would turn the trigger permission into reading the worker's files and fetching
its network. So an input named by a form is resolved against the roots the deployment declares
(the house storage root and the shipped traces, ``HOUSE_INPUT_ROOTS``) and refused before
anything is opened, stat'ed beyond the check itself, or fetched:

* a URL of a scheme no root has (``http``, ``https``, ``ftp``, ``gs`` ... and fsspec's chained
  ``a::b`` URLs), or a remote URI outside every root of its scheme;
* a ``..`` (or ``.``) path segment, whatever it would resolve to, a NUL or a line break;
* ``/proc``, ``/sys`` and ``/dev``, by name, even beneath a declared root;
* a local path (plain or ``file://``) whose real path (symlinks resolved: a link inside a root
  that leads out of it is refused) is under no root;
* a device, FIFO or socket (only plain files and folders are inputs).

Steps started by the house factory get the roots in :data:`ENV` (``STEPKIT_INPUT_ROOTS``) and
:mod:`stepkit.storage` checks every URI against them (:func:`enforce`); a step run from a plain
shell (no :data:`ENV`) reads any local path, as before. The DAGs' plan tasks check their params
with :func:`check` first, so a form fails at once naming the param. Stdlib only.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import StepError

#: The environment variable listing the roots a step may read (comma-separated); set by the
#: house factory on every DAG step, absent in a plain shell (no restriction).
ENV = "STEPKIT_INPUT_ROOTS"
#: Never inputs, whatever the roots say: kernel and device views of the machine running the step.
FORBIDDEN = ("/proc", "/sys", "/dev")
#: Longest piece of a refused value quoted back (the value is the user's, but bounded all the same).
_SHOW = 160


class Refused(StepError):
    """An input outside the allowed roots (exit 2). ``uri`` is the value refused."""

    def __init__(self, message: str, uri: str):
        super().__init__(message)
        self.uri = uri


def show(value: object) -> str:
    """A refused value quoted for a message: ``repr``, at most :data:`_SHOW` characters."""
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 4] + "...'"


def parse_roots(text: str | None) -> list[str]:
    """``a,b`` -> the roots, blanks dropped (a comma list: URIs hold colons)."""
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def env_roots() -> list[str] | None:
    """The roots in :data:`ENV`, or None where it is unset (a plain shell: no restriction)."""
    text = os.environ.get(ENV)
    return None if text is None else parse_roots(text)


def _scheme(uri: str) -> str | None:
    """``s3`` for ``s3://b/k``, ``file`` for ``file:///x``, None for a plain path."""
    head, sep, _ = uri.partition("://")
    return head.lower() if sep else None


def _local(uri: str) -> str:
    """The absolute path behind a plain path or ``file://`` URI, as :mod:`stepkit.storage` opens it."""
    path = uri[len("file://") :] if uri.lower().startswith("file://") else uri
    return os.path.abspath(os.path.expanduser(path))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _forbidden(path: str) -> str | None:
    return next((f for f in FORBIDDEN if _under(path, f)), None)


def _segments(uri: str) -> list[str]:
    rest = uri.split("://", 1)[1] if "://" in uri else uri
    return rest.replace("\\", "/").split("/")


@functools.lru_cache(maxsize=64)  # every storage call checks: resolve each root once per process
def _root_form(root: str) -> tuple[str | None, str]:
    """A root as (scheme, comparable location): a local root's real path; a remote root without
    its trailing slash."""
    scheme = _scheme(root)
    if scheme in (None, "file"):
        return None, os.path.realpath(_local(root))
    return scheme, root.rstrip("/")


def why_refused(uri: object, roots: Sequence[str]) -> str | None:
    """Why ``uri`` may not be read given ``roots`` (None: it may). Reads nothing but the local
    file system's own metadata (real path, file type) of a local path."""
    if not isinstance(uri, str) or not uri.strip():
        return "not a path or URI"
    if any(c in uri for c in "\0\r\n"):
        return "holds a NUL or a line break"
    if "::" in uri:
        return "a chained URL (a::b) is not an input"
    if any(s in ("..", ".") for s in _segments(uri)):
        return "a '..' or '.' path segment is not allowed (name the input by its plain path)"
    forms = [_root_form(r) for r in roots]
    allowed = ", ".join(roots) or "(none)"
    scheme = _scheme(uri)
    if scheme not in (None, "file"):
        mine = [loc for s, loc in forms if s == scheme]
        if not mine:
            schemes = sorted({s or "file" for s, _ in forms})
            return f"URLs of scheme {scheme}:// are not inputs here (allowed: {', '.join(schemes) or 'none'})"
        if not any(_under(uri.rstrip("/"), loc) for loc in mine):
            return f"outside the allowed roots ({allowed})"
        return None
    if scheme == "file" and not uri[len("file://") :].startswith("/"):
        return "a file:// URI with a host is not an input (file:///absolute/path)"
    path = _local(uri)
    bad = _forbidden(path)
    if bad:
        return f"{bad} is never an input"
    real = os.path.realpath(path)
    bad = _forbidden(real)
    if bad:
        return f"it resolves into {bad}, which is never an input"
    local_roots = [loc for s, loc in forms if s is None]
    if not any(_under(real, r) for r in local_roots):
        if any(_under(path, r) for r in local_roots):
            return f"a symbolic link leading outside the allowed roots ({allowed})"
        return f"outside the allowed roots ({allowed})"
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return None  # not there (yet): the step says so itself, naming the file
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "a device, FIFO or socket, not a file"
    return None


def check(uri: object, roots: Sequence[str], what: str) -> str:
    """``uri`` if it may be read under ``roots``, else :class:`Refused` naming ``what`` (the param
    or flag) and why, before anything is read."""
    why = why_refused(uri, roots)
    if why is not None:
        raise Refused(f"{what} {show(uri)} refused: {why}", uri if isinstance(uri, str) else repr(uri))
    return uri  # type: ignore[return-value]


def check_params(values: Mapping[str, Any], roots: Sequence[str]) -> None:
    """Each param of ``values`` (``{name: path or URI}``; empty ones skipped) checked: the
    :class:`Refused` of the first one outside ``roots`` names it (``param trace '/etc/shadow'
    refused: outside the allowed roots (...)``). For the DAGs' plan tasks, before any is read."""
    for name, value in values.items():
        if value not in (None, ""):
            check(value, roots, f"param {name}")


#: Folders of the running task package (its shipped data: the Faasm catalogue, packaged profiles),
#: readable by its steps whatever the roots say: code that ships with the image is no secret.
_packages: list[str] = []


def allow_package(name: str) -> None:
    """Let the steps of package ``name`` read its own folder (:func:`stepkit.cli.dispatch` calls it
    with the package whose step runs). Found without importing it; unknown names are ignored."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    for loc in (spec.submodule_search_locations or []) if spec else []:
        real = os.path.realpath(loc)
        if real not in _packages:
            _packages.append(real)


def allow_folder(path: str) -> None:
    """Let the steps read a local folder the deployment itself names in the step's environment
    (a Faasm catalogue of one's own, ``FAASM_CATALOGUE_DIR``): a trigger form sets no environment
    variable, so such a folder is the deployment's word, like the package's own files."""
    real = os.path.realpath(path)
    if real not in _packages:
        _packages.append(real)


def enforce(uri: str) -> None:
    """The check of :mod:`stepkit.storage`: only where :data:`ENV` is set (a DAG step); the running
    task package's own folder is readable too (:func:`allow_package`)."""
    roots = env_roots()
    if roots is not None:
        check(uri, [*roots, *_packages], "input")


def check_argv(argv: Sequence[str]) -> None:
    """Every value of a step's argv written as a URI (``scheme://...``) checked against :data:`ENV`'s
    roots, before the step starts (and before :mod:`stepkit.s3check` asks any bucket): a refusal
    names the flag. Plain paths cannot be told from names (a preset ``ls6``) here; the storage
    layer checks them when they are opened. Nothing is checked where :data:`ENV` is unset."""
    roots = env_roots()
    if roots is None:
        return
    argv = list(argv)
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=") if a.startswith("--") else ("", "", a)
        if not eq and not flag and i and argv[i - 1].startswith("--") and "=" not in argv[i - 1]:
            flag = argv[i - 1]
        if "://" in value:
            check(value, roots, flag or "argument")


_MAGIC = (
    (b"\x1f\x8b", "gzip data"),
    (b"BZh", "bzip2 data"),
    (b"\xfd7zXZ\x00", "xz data"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PAR1", "Parquet data"),
    (b"\x7fELF", "an executable (ELF)"),
)


def describe_bytes(head: bytes, size: int | None = None) -> str:
    """What a file that could not be used looks like, never what it says: its size and the kind
    of its first bytes (empty, gzip/bzip2/xz/zip/Parquet, binary, or text with its line count and
    the first line's length). For error and log messages about an input: quoting a file that is
    not what it was meant to be may print a secret into a task log."""
    size = len(head) if size is None else size
    if size == 0:
        return "empty (0 bytes)"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{size} bytes of {what}"
    sample = head[:4096]
    printable = sum(32 <= b < 127 or b in (9, 10, 13) or b >= 128 for b in sample)
    if b"\0" in sample or printable < 0.9 * len(sample):
        return f"{size} bytes of binary data"
    first = sample.split(b"\n", 1)[0].rstrip(b"\r")
    lines = sample.count(b"\n") + (not sample.endswith(b"\n"))
    many = "" if len(sample) == size else " or more"
    return (
        f"{size} bytes of text, {lines}{many} line(s); the first: {len(first)} bytes, "
        f"{len(first.split())} whitespace-separated field(s)"
    )


def flags_naming(uri: str, argv: Iterable[str]) -> list[str]:
    """The flags of ``argv`` (``--flag value`` or ``--flag=value``) whose value is ``uri``: what a
    refusal met deep inside a step names (the CLI adds it to the message)."""
    argv = list(argv)
    out = []
    for i, a in enumerate(argv):
        if a.startswith("--") and "=" in a:
            flag, value = a.split("=", 1)
            if value == uri:
                out.append(flag)
        elif a.startswith("--") and i + 1 < len(argv) and argv[i + 1] == uri:
            out.append(a)
    return list(dict.fromkeys(out))
