"""metrics.h5: one extendable dataset per scalar, one row per learner update.

Written in HDF5's single-writer/multiple-reader mode, so `read_metrics` (or h5py, h5dump with
SWMR) can follow a run while it goes on, and a crash leaves every row written so far readable.
Optionally every row is mirrored as TensorBoard scalars in event files beside it.
"""
from __future__ import annotations

import os
import time

import h5py
import numpy as np


class MetricsWriter:
    """Appends rows of named scalars (and fixed-width vectors); every row has the same keys."""

    def __init__(self, path: str, attrs: dict[str, str] | None = None, resume_through_version: int | None = None,
                 tensorboard_dir: str | None = None):
        """A new file; or, with `resume_through_version`, the existing one cut back to the rows of
        policy versions up to the resumed checkpoint's, so the series continue without a gap or repeat.
        `tensorboard_dir`: also write every row there as TensorBoard scalars (step = frames)."""
        if resume_through_version is None or not os.path.exists(path):
            self.file = h5py.File(path, "w", libver="latest")
            self.rows = 0
        else:
            self.file = h5py.File(path, "a", libver="latest")
            versions = self.file["policy_version"][()] if "policy_version" in self.file else np.zeros(0)
            self.rows = int(np.searchsorted(versions, resume_through_version, side="right"))
            for key in self.file:
                self.file[key].resize(self.rows, axis=0)
            if self.rows:
                self.file.swmr_mode = True
        for key, value in (attrs or {}).items():
            self.file.attrs[key] = value
        self.tensorboard = None
        if tensorboard_dir is not None:
            # TensorBoard drops what an earlier session wrote from this step on: the rows cut above
            kept_frames = int(self.file["frames"][self.rows - 1]) if self.rows and "frames" in self.file else -1
            self.tensorboard = TensorBoardScalars(tensorboard_dir, purge_from_step=kept_frames + 1)

    def append(self, row: dict[str, float | np.ndarray]) -> None:
        values = {key: np.asarray(value) for key, value in row.items()}
        if not len(self.file):  # first row: create one dataset per key
            for key, value in values.items():
                dtype = np.int64 if np.issubdtype(value.dtype, np.integer) else np.float64
                self.file.create_dataset(key, shape=(0, *value.shape), maxshape=(None, *value.shape),
                                         dtype=dtype, chunks=(256, *value.shape))
            self.file.swmr_mode = True  # datasets exist: readers may open the file from now on
        if set(values) != set(self.file.keys()):
            raise ValueError(f"metrics row keys changed: {sorted(set(values) ^ set(self.file.keys()))}")
        for key, value in values.items():
            ds = self.file[key]
            ds.resize(self.rows + 1, axis=0)
            ds[self.rows] = value
            ds.flush()
        self.rows += 1
        if self.tensorboard is not None:
            self.tensorboard.append(row)

    def close(self) -> None:
        self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


class TensorBoardScalars:
    """Metrics rows as TensorBoard scalars (tag = the metrics key, step = `frames`), so
    `tensorboard --logdir runs` shows every run. Written with the tensorboard package's own event
    writer: no torch needed. TensorBoard stores scalars as float32."""

    def __init__(self, log_dir: str, purge_from_step: int = 0):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._event, self._summary = Event, Summary
        self.writer = EventFileWriter(log_dir)
        # A session start at step s makes TensorBoard discard every event of earlier files with a
        # step >= s (what torch's SummaryWriter(purge_step=s) writes): a resumed run's cut rows.
        self.writer.add_event(Event(step=purge_from_step, wall_time=time.time(),
                                    session_log=SessionLog(status=SessionLog.START)))

    def append(self, row: dict[str, float | np.ndarray]) -> None:
        values = [self._summary.Value(tag=key, simple_value=float(value))
                  for key, value in row.items() if np.ndim(value) == 0]  # vectors (replica digests) stay in HDF5
        self.writer.add_event(self._event(step=int(row["frames"]), wall_time=time.time(),
                                          summary=self._summary(value=values)))
        self.writer.flush()  # readers see each row at once, as they do in metrics.h5

    def close(self) -> None:
        self.writer.close()


def read_metrics(path: str) -> dict[str, np.ndarray]:
    """Every series of a metrics file, also while its run is still writing it."""
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        return {key: f[key][()] for key in f}
