"""What the Mirage steps write and read back: output file names, byte writers, committed readers.

One module for every file one step writes and another reads, so a name is spelled once:

| step       | files under ``--out``                                             |
|------------|-------------------------------------------------------------------|
| ``sample`` | ``shard.npz``, ``probes.parquet``, ``shard.json``                 |
| ``merge``  | ``dataset.npz``, ``probes.parquet``, ``manifest.json``            |
| ``validate`` | ``validation.parquet``, ``decisions.parquet``, ``validate.json`` |
| ``metrics`` | ``metrics.json``, ``metrics.parquet``, ``metrics.csv``, ``metrics.md``, ``samples.parquet`` |

Importing this module is cheap (numpy, pandas and pyarrow load when a function needs them).
No pickle: arrays are ``.npz`` read with ``allow_pickle=False``, tables are Parquet.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

from stepkit import StepError, require_committed, storage
from stepkit.step import trust_containing

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

# sample
SHARD_FILE = "shard.npz"
PROBES_FILE = "probes.parquet"  # also the merged dataset's per-probe metadata
SHARD_INFO_FILE = "shard.json"
# merge
DATASET_FILE = "dataset.npz"
MANIFEST_FILE = "manifest.json"
DATASET_KEYS = ("X", "y", "sample", "sample_start", "probe_time", "node")
# validate
ROWS_FILE = "validation.parquet"
DECISIONS_FILE = "decisions.parquet"
VALIDATE_INFO_FILE = "validate.json"
# metrics
METRICS_JSON = "metrics.json"
METRICS_TABLE = "metrics.parquet"
METRICS_CSV = "metrics.csv"
METRICS_MD = "metrics.md"
METRICS_SAMPLES = "samples.parquet"


def npz_bytes(arrays: dict[str, np.ndarray], compress: bool = True) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)
    return buf.getvalue()


def read_npz(uri: str) -> dict[str, np.ndarray]:
    import numpy as np

    with storage.open_read(uri) as f:
        z = np.load(io.BytesIO(f.read()), allow_pickle=False)
        return {k: z[k] for k in z.files}


def parquet_bytes(df: pd.DataFrame) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf, compression="zstd")
    return buf.getvalue()


def read_parquet(uri: str) -> pd.DataFrame:
    import pyarrow.parquet as pq

    with storage.open_read(uri) as f:
        return pq.read_table(f).to_pandas()


def _committed(uri: str, step: str) -> dict[str, Any]:
    marker = require_committed(uri, f"{step} output")
    if marker.get("step") != step:
        raise StepError(f"{uri}: not a {step} output (step {marker.get('step')!r})")
    return marker


def load_shard(uri: str) -> tuple[dict[str, np.ndarray], pd.DataFrame, dict]:
    """(arrays, probes frame, shard.json) of a ``sample`` output."""
    arrays = read_npz(storage.join(uri, SHARD_FILE))
    probes = read_parquet(storage.join(uri, PROBES_FILE))
    info = json.loads(storage.read_bytes(storage.join(uri, SHARD_INFO_FILE)))
    return arrays, probes, info


def load_rows(uri: str) -> tuple[pd.DataFrame, dict, dict]:
    """(rows, validate.json, marker) of a committed ``validate`` output."""
    marker = _committed(uri, "validate")
    rows = read_parquet(storage.join(uri, ROWS_FILE))
    info = storage.read_json(storage.join(uri, VALIDATE_INFO_FILE))
    return rows, info, marker


def load_metrics(uri: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(metrics rows, samples with levels, metrics.json) of a committed ``metrics`` output."""
    _committed(uri, "metrics")
    table = read_parquet(storage.join(uri, METRICS_TABLE))
    samples = read_parquet(storage.join(uri, METRICS_SAMPLES))
    return table, samples, storage.read_json(storage.join(uri, METRICS_JSON))


def require_input(uri: str, flag: str, step: str | None = None) -> dict[str, Any] | None:
    """An input of a step: a folder must be a committed step output (its ``_SUCCESS.json``
    present), never one being written or replaced; a single ``.parquet`` file (written
    atomically) is taken as is. Returns the folder's marker (None for a file). With ``step``
    the folder must be that step's output (a ``sample`` output where a ``merge`` dataset is
    expected is exit 2 naming the flag, not a missing-file error later).

    Either way the files read from a committed folder are checked against its marker
    (:func:`stepkit.step.verify_read`): a single file only when its folder's marker lists it."""
    if uri.endswith(".parquet"):
        if step is not None:
            raise StepError(f"{flag} {uri}: a single file, not a {step} output (a folder with its {step} marker)")
        trust_containing(uri)
        return None
    marker = require_committed(uri, flag)
    if step is not None and marker.get("step") not in DATASET_WRITERS.get(step, (step,)):
        raise StepError(f"{flag} {uri}: a {marker.get('step')!r} output, not a {step} output")
    return marker


#: Writers of an output kind besides the step of its name: ``models.datasets.write_dataset`` (the
#: synthetic datasets of the tests and benches) commits the ``merge`` format as step ``dataset``.
DATASET_WRITERS = {"merge": ("merge", "dataset")}
