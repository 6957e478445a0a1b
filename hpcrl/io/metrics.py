"""metrics.h5: one extendable dataset per scalar, one row per learner update.

Written in HDF5's single-writer/multiple-reader mode, so `read_metrics` (or h5py, h5dump with
SWMR) can follow a run while it goes on, and a crash leaves every row written so far readable.
Optionally every row is mirrored as TensorBoard scalars in event files beside it (io/tensorboard.py).

Rows may be buffered (`flush_interval_s`) and written as one block per series: a learner that
updates many times a second (small async batches) would otherwise spend a large share of its core
in HDF5's per-dataset calls (about 1 ms per row for 25 series here). A resume cuts the file back
to its checkpoint anyway, so the run files flush before every checkpoint and lose nothing a resume
would keep.

A run that was killed (kill -9, the OOM killer, a dead node) leaves SWMR's "open for writing"
flags in the file, which make HDF5 refuse to open it for writing again. `rebuild_metrics`, run
when a run resumes, reads what can be read (an SWMR reader ignores those flags) and writes it
back as a new, closed file, cut to the checkpoint's rows.

A run directory is data (io/h5safe.py): reading metrics.h5 is bounded in time and memory, and a
symbolic link at the metrics path is replaced by a new file, never written through (its target
is left as it is); `write_crossed_nodes` refuses one.
"""
from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass

import h5py
import numpy as np

from hpcrl.core.faults import pause_point
from hpcrl.io.h5safe import (DAMAGE_ERRORS, RefusedFileError, check_contents, open_for_reading,
                              open_for_writing, unlink_if_link, writes_fail_as_os_errors)

CHUNK_ROWS = 256


def _create_series(file: h5py.File, key: str, dtype, row_shape: tuple, data: np.ndarray | None = None) -> None:
    file.create_dataset(key, shape=(0, *row_shape) if data is None else None, data=data,
                        maxshape=(None, *row_shape), dtype=dtype, chunks=(CHUNK_ROWS, *row_shape))


class MetricsWriter:
    """Appends rows of named scalars (and fixed-width vectors); every row has the same keys."""

    def __init__(self, path: str, attrs: dict[str, str] | None = None, resume: bool = False,
                 tensorboard_dir: str | None = None, flush_interval_s: float = 0.0, mirrors: tuple = ()):
        """A new file; or, with `resume`, the existing one continued (a resumed run first cuts it
        back to its checkpoint with `rebuild_metrics`). `tensorboard_dir`: also write every row
        there as TensorBoard scalars (step = frames). `flush_interval_s`: hold rows in memory and
        write them together once this long has passed since the last write (0: every row at once);
        `flush()` and `close()` write what is held. `mirrors`: more sinks every written row goes to
        (`append(rows)`, `close()`: Weights & Biases, io/wandb_log.py)."""
        self.path = path
        self.flush_interval_s = flush_interval_s
        self._pending: list[dict[str, np.ndarray]] = []
        self._last_flush = time.perf_counter()
        unlink_if_link(path)  # rundir.prepare has rebuilt a linked file as the run's own already
        if not resume or not os.path.exists(path):
            self.file = open_for_writing(path, "w", libver="latest")
            self.rows = 0
        else:
            self.file = open_for_writing(path, "a", libver="latest")
            self.rows = min((self.file[key].shape[0] for key in self.file), default=0)
        # a resumed file turns to SWMR with its first row, once that row's new series are created
        self._resumed = bool(len(self.file))
        for key, value in (attrs or {}).items():
            self.file.attrs[key] = value
        self.mirrors = list(mirrors)
        self.tensorboard = None
        if tensorboard_dir is not None:
            # TensorBoard drops what an earlier session wrote from this step on: the rows cut above
            kept_frames = int(self.file["frames"][self.rows - 1]) if self.rows and "frames" in self.file else -1
            from hpcrl.io.tensorboard import TensorBoardScalars  # (the tensorboard package only where asked)
            self.tensorboard = TensorBoardScalars(tensorboard_dir, purge_from_step=kept_frames + 1,
                                                  config_text=(attrs or {}).get("config"))

    def append(self, row: dict[str, float | np.ndarray]) -> None:
        values = {key: np.asarray(value) for key, value in row.items()}
        if self._resumed:  # the first row of a resumed run: its series may differ from the file's
            keys = self._take_series_of(values)
            self._resumed = False
            self.file.swmr_mode = True  # (HDF5 creates no dataset in SWMR mode)
        else:
            keys = set(self.file.keys()) or set(self._pending[0] if self._pending else values)
        if set(values) != keys:
            raise ValueError(f"metrics row keys changed: {sorted(set(values) ^ keys)}")
        self._pending.append(values)
        if time.perf_counter() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def _take_series_of(self, values: dict[str, np.ndarray]) -> set[str]:
        """A resumed run whose config adds or drops a series of floating-point values (run.eval
        turned on, a scheduled key added): a new series is created with NaN in the earlier rows,
        and a dropped one gets NaN in this launch's rows (in `values`), so that every row keeps
        every key. Returns the file's series."""
        for key, value in values.items():
            if key not in self.file and np.issubdtype(value.dtype, np.floating):
                with writes_fail_as_os_errors(self.path):
                    _create_series(self.file, key, np.float64, value.shape,
                                   np.full((self.rows, *value.shape), np.nan))
        for key in self.file:
            if key not in values and np.issubdtype(self.file[key].dtype, np.floating):
                values[key] = np.full(self.file[key].shape[1:], np.nan)
        return set(self.file.keys())

    def flush(self) -> None:
        """Write the rows held in memory: each series grows once, by all of them."""
        if not self._pending:
            return
        with writes_fail_as_os_errors(self.path):
            self._write_pending()

    def _write_pending(self) -> None:
        rows, self._pending = self._pending, []
        self._last_flush = time.perf_counter()
        if not len(self.file):  # first rows: create one dataset per key
            for key, value in rows[0].items():
                _create_series(self.file, key, np.int64 if np.issubdtype(value.dtype, np.integer) else np.float64,
                               value.shape)
            self.file.swmr_mode = True  # datasets exist: readers may open the file from now on
        end = self.rows + len(rows)
        for i, key in enumerate(rows[0]):
            if i == len(rows[0]) // 2:
                pause_point("metrics")  # tests: a kill here leaves half a row
            ds = self.file[key]
            ds.resize(end, axis=0)
            ds[self.rows:end] = np.stack([r[key] for r in rows])
            ds.flush()
        self.rows = end
        if self.tensorboard is not None:
            self.tensorboard.append(rows)
        for mirror in self.mirrors:
            mirror.append(rows)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with writes_fail_as_os_errors(self.path):
                self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        for mirror in self.mirrors:
            mirror.close()


CROSSED_NODES = "crossed_nodes"  # attributes: what the run's last launch sent across nodes, per stream
STARTUP = "startup"  # attributes: each rank's start-up marks in the run's last launch (core/startup.py)


def _set_attributes(path: str, attrs: dict) -> None:
    """Set attributes of the metrics file at `path` (totals of a launch, not rows)."""
    if os.path.islink(path):  # appending cannot replace the link without losing the rows behind it
        raise OSError(f"{path} is a symbolic link (to {os.readlink(path)!r}); hpcrl writes only the run's own file")
    with open_for_writing(path, "a", libver="latest") as f:
        for name, value in attrs.items():
            f.attrs[name] = value


def write_crossed_nodes(path: str, streams: tuple[str, ...], sums: np.ndarray) -> None:
    """Attributes of metrics.h5 (not series: they are totals of the launch, not rows):
    crossed_nodes_streams, crossed_nodes_messages and crossed_nodes_bytes, in the same order."""
    _set_attributes(path, {f"{CROSSED_NODES}_streams": list(streams),
                           f"{CROSSED_NODES}_messages": sums[:, 0].astype(np.int64),
                           f"{CROSSED_NODES}_bytes": sums[:, 1].astype(np.int64)})


def read_crossed_nodes(path: str) -> dict[str, tuple[int, int]]:
    """{stream: (messages, bytes)} that crossed nodes in the run's last launch ({} if not recorded)."""
    with open_for_reading(path, swmr=True) as f:
        if f"{CROSSED_NODES}_streams" not in f.attrs:
            return {}
        names = [str(n) for n in f.attrs[f"{CROSSED_NODES}_streams"]]
        return {n: (int(m), int(b)) for n, m, b in zip(names, f.attrs[f"{CROSSED_NODES}_messages"],
                                                       f.attrs[f"{CROSSED_NODES}_bytes"])}


def write_startup(path: str, marks: tuple[str, ...], seconds: np.ndarray) -> None:
    """Attributes of metrics.h5: startup_marks (names, hpcrl.core.startup.MARKS) and
    startup_seconds [rank, mark], each rank's seconds from its exec to the end of each start-up
    phase in the run's last launch (NaN where a rank has no such phase)."""
    _set_attributes(path, {f"{STARTUP}_marks": list(marks),
                           f"{STARTUP}_seconds": np.asarray(seconds, dtype=np.float64)})


def read_startup(path: str) -> dict[str, np.ndarray]:
    """{mark: seconds since exec per rank} of the run's last launch ({} if not recorded)."""
    with open_for_reading(path, swmr=True) as f:
        if f"{STARTUP}_marks" not in f.attrs:
            return {}
        names = [str(n) for n in f.attrs[f"{STARTUP}_marks"]]
        seconds = np.asarray(f.attrs[f"{STARTUP}_seconds"], dtype=np.float64).reshape(-1, len(names))
        return {name: seconds[:, i] for i, name in enumerate(names)}


# The series every row of a learner holds, which a report of a run's progress reads.
PROGRESS_SERIES = ("frames", "policy_version", "wall_time")


def read_metrics(path: str) -> dict[str, np.ndarray]:
    """Every series of a metrics file, also while its run is still writing it: the series that
    are there, which may lack some that hpcrl writes (a damaged file, or one from elsewhere; see
    `missing_series`) and may differ in length by a row (a kill inside an append). OSError if
    the file cannot be read, RefusedFileError (an OSError) if it is not one to read."""
    return _read_all(path)[0]


def missing_series(metrics: dict[str, np.ndarray], names: tuple[str, ...] = PROGRESS_SERIES) -> list[str]:
    """The `names` that `metrics` (from `read_metrics`) lacks: a caller reporting progress says
    which series are missing instead of failing on the first."""
    return [name for name in names if name not in metrics]


def _read_all(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """(series, attributes) of a metrics file, as an SWMR reader: it ignores the "open for
    writing" flags of a live or killed writer. Any failure is an OSError naming the file."""
    try:
        with open_for_reading(path, swmr=True) as f:
            check_contents(f, path, written_whole=False)  # a live writer grows a series before filling it
            return {key: f[key][()] for key in f if isinstance(f[key], h5py.Dataset)}, dict(f.attrs)
    except (RefusedFileError, FileNotFoundError):
        raise  # they name the file already
    except DAMAGE_ERRORS as exc:  # h5py's own errors do not
        raise OSError(f"{path}: unreadable HDF5 file ({exc})") from None


@dataclass
class Rebuilt:
    """What `rebuild_metrics` kept, and what it could not read."""

    rows: int  # rows in the rebuilt file
    problem: str = ""  # why the old file could not be read whole ('' when it could)
    damaged_copy: str = ""  # where that unreadable file was moved


def rebuild_metrics(path: str, through_version: int) -> Rebuilt:
    """Rewrite `path` as a closed file holding its rows of policy versions up to `through_version`
    (the resumed checkpoint's), in order. A file that cannot be read whole is moved aside to
    `metrics.damaged.<time>.h5` (kept for a look or HDF5's recovery tools, never deleted), and the
    rebuilt file starts empty. Writes a temporary file and renames it, so a kill during the
    rebuild leaves the old file in place."""
    series, attrs, problem = _salvage(path) if os.path.exists(path) else ({}, {}, "")
    damaged = ""
    if problem:
        damaged = f"{os.path.splitext(path)[0]}.damaged.{time.strftime('%Y%m%d-%H%M%S')}.h5"
        os.replace(path, damaged)
    rows = _rows_through(series, through_version)
    tmp = f"{path}.tmp.{os.getpid()}"
    unlink_if_link(tmp)
    with h5py.File(tmp, "w", libver="latest") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        for key, data in series.items() if rows else ():
            _create_series(f, key, data.dtype, data.shape[1:], data[:rows])
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return Rebuilt(rows, problem, damaged)


def _salvage(path: str) -> tuple[dict[str, np.ndarray], dict, str]:
    """(series, attributes, problem) of a metrics file; nothing and the problem if any part is
    unreadable (a series cannot be left out: every row has every key)."""
    try:
        return (*_read_all(path), "")
    except OSError as exc:
        return {}, {}, str(exc)


def _rows_through(series: dict[str, np.ndarray], through_version: int) -> int:
    """Leading rows that every series holds (a kill inside `append` leaves some one row longer)
    whose policy versions rise and stay within `through_version`."""
    if not series:
        return 0
    rows = min(len(v) for v in series.values())
    versions = series["policy_version"][:rows] if "policy_version" in series else np.zeros(0)
    ok = (versions <= through_version) & np.concatenate([[True], np.diff(versions) > 0])[:len(versions)]
    return rows if ok.all() else int(np.argmin(ok))


def remove_temporaries(path: str) -> list[str]:
    """Delete `path.tmp.*` left by a writer that was killed; returns what was removed."""
    stale = sorted(glob.glob(glob.escape(path) + ".tmp.*"))
    for name in stale:
        os.unlink(name)
    return stale
