"""Small JSON records in storage (a missed deadline, an approval's answer), committed whole."""

from __future__ import annotations

import json
import os
from typing import Any


def commit_json(path: str, record: dict[str, Any]) -> str:
    """Write ``record`` as JSON at ``path`` (a local path or an fsspec URI): locally to a temporary
    name, then renamed, so a reader never sees half a record; an object store's put is whole or
    nothing. Returns ``path``."""
    from fsspec.core import url_to_fs

    body = json.dumps(record, indent=2, sort_keys=True) + "\n"
    fs, fpath = url_to_fs(path)
    parent = fpath.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        tmp = f"{fpath}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, fpath)
    else:
        with fs.open(fpath, "w") as f:
            f.write(body)
    return path
