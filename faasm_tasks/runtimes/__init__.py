"""The local target's two systems: the C functions (faasm_tasks/functions) as WebAssembly on
wasmtime (``wasm``: Faaslets) and as native static binaries in runc containers (``native``).

Each worker process hosts one runtime. A call names a module (a workload's, :func:`faasm_tasks.workloads.modules`) and an index
(``faasm_main(index)``); the function reaches state, shared files and other calls through
the host interface of ``faasm.h``:

* ``wasm``: one :class:`WasmRuntime` per worker, the runtime process of its Faaslets. Each
  module is compiled once and the machine code cached on disk (``Module.serialize``, as
  Faasm's codegen step), each call runs in an instance: a fresh one on a cold start, an idle
  one reused when warm. Instances share the worker's state region (:class:`LocalTier`, Faasm's
  local tier), synchronised with Redis (its global tier): reads come from the region, writes
  and element-wise adds go to both, ``pull_state`` refreshes the region. Memory per instance
  is bounded (store limits), a call past its deadline is interrupted (epochs), a trap fails
  that call only (the instance is dropped).
* ``native``: one :class:`NativeRuntime` per worker, a pool of containers started with
  ``runc run`` (read-only root holding the static binary only, its own pid, mount, network,
  ipc and uts namespaces, a memory cgroup with the limit). A container serves one call at a
  time over its stdin/stdout (the protocol in ``host_native.c``); its state reads and writes
  are copies in and out of Redis (:class:`GlobalTier`), as the seed's native containers do.
  A cold start creates a container; a call past its deadline or a crash kills it.

The modules: ``common`` (build paths and artefacts, a call and its resolution, the
failure), ``state`` (the tiers, the host), ``wasm`` (the wasmtime runtime), ``runc`` (runc
itself, a container's OCI spec, the framing, a container), ``native`` (the container pool)
and ``inprocess`` (chained calls on a thread pool). The package re-exports the names its
callers use; a module-level value is patched where it is defined
(``faasm_tasks.runtimes.common.BUILD_DIR``), not here.
"""

from __future__ import annotations

from .common import SYSTEMS, Call, CallFailed, artefact, build_problems
from .inprocess import InProcess
from .native import NativeRuntime
from .runc import runc_binary, runc_list, runc_remove
from .state import GlobalTier, Host, LocalTier
from .wasm import WasmRuntime, wasmtime_version

__all__ = [
    "SYSTEMS",
    "Call",
    "CallFailed",
    "GlobalTier",
    "Host",
    "InProcess",
    "LocalTier",
    "NativeRuntime",
    "WasmRuntime",
    "artefact",
    "build_problems",
    "runc_binary",
    "runc_list",
    "runc_remove",
    "wasmtime_version",
]
