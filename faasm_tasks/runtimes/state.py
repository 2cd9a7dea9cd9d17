"""The state tiers (:class:`GlobalTier`: Redis only, :class:`LocalTier`: the worker's region
over Redis) and :class:`Host`, what the host interface needs from the worker."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Element-wise float64 adds on a Redis string, atomic (a script runs alone): Hogwild's update.
ADD_F64 = """
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local k = struct.unpack('<i4', ARGV[2], i * 4 + 1)
  local v = struct.unpack('<d', ARGV[3], i * 8 + 1)
  local cur = redis.call('GETRANGE', KEYS[1], k * 8, k * 8 + 7)
  local c = 0
  if #cur == 8 then c = struct.unpack('<d', cur) end
  redis.call('SETRANGE', KEYS[1], k * 8, struct.pack('<d', c + v))
end
return n
"""


class GlobalTier:
    """State in Redis only: every read is a copy out of it, every write a copy into it."""

    def __init__(self, r):
        self.r = r
        self._add = r.register_script(ADD_F64)

    def read(self, key: str) -> bytes | None:
        return self.r.get(key)

    def write(self, key: str, data: bytes) -> None:
        self.r.set(key, data)

    def add_f64(self, key: str, idx: np.ndarray, vals: np.ndarray) -> None:
        if len(idx):
            self._add(keys=[key], args=[len(idx), idx.astype("<i4").tobytes(), vals.astype("<f8").tobytes()])

    def pull(self, key: str) -> None:
        pass


class LocalTier(GlobalTier):
    """The worker's state region shared by its instances (Faasm's local tier) over Redis."""

    def __init__(self, r):
        super().__init__(r)
        self.region: dict[str, bytearray] = {}
        self.lock = threading.Lock()

    def read(self, key: str) -> bytes | None:
        with self.lock:
            val = self.region.get(key)
        if val is None:
            self.pull(key)
            with self.lock:
                val = self.region.get(key)
        return val

    def write(self, key: str, data: bytes) -> None:
        with self.lock:
            self.region[key] = bytearray(data)
        super().write(key, data)

    def add_f64(self, key: str, idx: np.ndarray, vals: np.ndarray) -> None:
        with self.lock:
            val = self.region.get(key)
            if val is not None and len(idx) and int(idx.max()) * 8 + 8 <= len(val):
                np.add.at(np.frombuffer(val, dtype="<f8"), idx, vals)  # in place: the instances see it
        super().add_f64(key, idx, vals)

    def pull(self, key: str) -> None:
        val = self.r.get(key)
        with self.lock:
            if val is None:
                self.region.pop(key, None)
            else:
                self.region[key] = bytearray(val)

    def clear(self) -> None:
        with self.lock:
            self.region.clear()


@dataclass
class Host:
    """What the host interface needs from the worker: state, shared files, chaining."""

    tier: GlobalTier
    shared_dir: str
    chain: Callable[[dict[str, Any]], int]
    await_call: Callable[[int, float], tuple[bool, str]]
    call_timeout_s: float = 600.0

    def read_file(self, path: str) -> bytes | None:
        full = os.path.realpath(os.path.join(self.shared_dir, path.lstrip("/")))
        if not full.startswith(os.path.realpath(self.shared_dir) + os.sep):
            return None
        try:
            with open(full, "rb") as f:
                return f.read()
        except OSError:
            return None
