"""Storage URIs through fsspec: ``file://``, plain local paths, ``s3://``, ``https://``.

Every step reads and writes through these helpers so that the same code runs on a
laptop (local files) and in a pod (S3). Writes are atomic where readers look:

* local files are written to a hidden temporary name in the same directory and
  renamed into place (``os.replace``), so a reader sees the old file or the new one;
* object stores (S3) publish an object only when its upload completes, so a failed
  write leaves nothing at the key.

In a DAG step every URI must lie under the roots the deployment allows (:mod:`stepkit.reach`):
a form's value is data, never a way to read the worker's files or fetch its network.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any

import fsspec
from fsspec.core import url_to_fs

from . import reach

_CHUNK = 1 << 20


def is_local(uri: str) -> bool:
    """True for plain paths and ``file://`` URIs."""
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    """The filesystem path behind a local URI (``file:///x`` -> ``/x``)."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return uri


def normalize(uri: str) -> str:
    """Absolute path for local URIs (so fingerprints do not depend on the cwd); others unchanged."""
    if is_local(uri):
        return os.path.abspath(os.path.expanduser(local_path(uri)))
    return uri.rstrip("/") if uri.count("/") > 3 else uri


def join(base: str, *parts: str) -> str:
    """Join path parts onto a URI with ``/`` (never the OS separator)."""
    base = normalize(base)
    if is_local(base):
        return os.path.join(base, *parts)
    return posixpath.join(base, *parts)


def _options(uri: str) -> dict[str, Any]:
    """Filesystem arguments taken from the environment. fsspec reuses a filesystem made with
    the same arguments, so an S3 endpoint read from ``AWS_ENDPOINT_URL(_S3)`` is passed
    explicitly: a process whose endpoint setting changed never gets the old endpoint's client."""
    if uri.startswith(("s3://", "s3a://")):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            return {"endpoint_url": endpoint}
    return {}


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and in-filesystem path for ``uri``.

    In a DAG step (``STEPKIT_INPUT_ROOTS`` set by the house factory) a URI outside the allowed
    roots is refused here, before any filesystem is made (:mod:`stepkit.reach`)."""
    reach.enforce(uri)
    fs, path = url_to_fs(normalize(uri) if is_local(uri) else uri, **_options(uri))
    return fs, path


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.exists(path)


#: Called with every URI :func:`open_read` opens, before opening it: ``stepkit.step`` checks a
#: file of a committed upstream output against its marker there (``stepkit.step.verify_read``).
read_check: Callable[[str], None] | None = None


def open_read(uri: str, mode: str = "rb", compression: str | None = None) -> IO[Any]:
    """Open for reading; ``compression="infer"`` decompresses ``.gz``/``.bz2``/``.xz`` by suffix.

    A file of a committed upstream output is checked against its marker first (:data:`read_check`)."""
    if read_check is not None:
        read_check(uri)
    return _open(uri, mode, compression)


def _open(uri: str, mode: str = "rb", compression: str | None = None) -> IO[Any]:
    reach.enforce(uri)  # every open, read or write: a form's value never reaches fsspec unchecked
    return fsspec.open(normalize(uri) if is_local(uri) else uri, mode, compression=compression, **_options(uri)).open()


def read_bytes(uri: str) -> bytes:
    with open_read(uri) as f:
        return f.read()


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri).decode("utf-8"))


@contextlib.contextmanager
def atomic_write(uri: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write ``uri`` so that readers never see a partial file.

    On an exception nothing is left at ``uri`` (a previous version, if any, stays).
    """
    if is_local(uri):
        path = normalize(uri)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, mode) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return
    fs, path = filesystem(uri)
    parent = posixpath.dirname(path)
    with contextlib.suppress(Exception):
        fs.makedirs(parent, exist_ok=True)
    # Object stores publish on a successful close only; on error fsspec aborts the upload.
    f = fs.open(path, mode)
    try:
        yield f
    except BaseException:
        with contextlib.suppress(Exception):
            f.discard() if hasattr(f, "discard") else None
        raise
    f.close()


def write_bytes(uri: str, data: bytes) -> None:
    with atomic_write(uri, "wb") as f:
        f.write(data)


def write_json(uri: str, obj: Any) -> None:
    write_bytes(uri, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8"))


def remove(uri: str) -> None:
    """Delete a file if present (missing is fine)."""
    fs, path = filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        if fs.exists(path):
            fs.rm(path)


def sha256_of(uri: str) -> str:
    """Streamed SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with _open(uri) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def size_of(uri: str) -> int:
    fs, path = filesystem(uri)
    return int(fs.info(path)["size"])


def list_files(uri: str) -> list[str]:
    """Relative names of the files below a directory URI (recursive, sorted)."""
    fs, path = filesystem(uri)
    if not fs.exists(path):
        return []
    base = path.rstrip("/") + "/"
    out = []
    for p in fs.find(path):
        rel = p[len(base) :] if p.startswith(base) else posixpath.basename(p)
        out.append(rel)
    return sorted(out)
