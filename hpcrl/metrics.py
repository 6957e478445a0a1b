"""metrics.h5: one extendable dataset per scalar, one row per learner update."""
from __future__ import annotations

import h5py
import numpy as np


class MetricsWriter:
    """Appends rows of named scalars (and fixed-width vectors); flushed after every row."""

    def __init__(self, path: str, attrs: dict[str, str] | None = None):
        self.file = h5py.File(path, "w")
        for key, value in (attrs or {}).items():
            self.file.attrs[key] = value
        self.rows = 0

    def append(self, row: dict[str, float | np.ndarray]) -> None:
        for key, value in row.items():
            value = np.asarray(value)
            if key not in self.file:
                dtype = np.int64 if np.issubdtype(value.dtype, np.integer) else np.float64
                self.file.create_dataset(key, shape=(0, *value.shape), maxshape=(None, *value.shape),
                                         dtype=dtype, chunks=(256, *value.shape))
            ds = self.file[key]
            ds.resize(self.rows + 1, axis=0)
            ds[self.rows] = value
        self.rows += 1
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def read_metrics(path: str) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {key: f[key][()] for key in f}
