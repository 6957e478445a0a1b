"""A run directory's HDF5 files, which travel between people and may come from anyone, are data:
every read is bounded in time and in memory, a file that could break that bound is refused, and
hpcrl never writes through a symbolic link placed in the directory (`unlink_if_link`).

- Only regular files are opened (a link to one is fine): open() on a named pipe waits until
  someone writes to it, a device may never end.
- Metadata reads are retried a bounded number of times. An SWMR reader retries a read whose
  checksum fails (the writer may be half way through writing it) with a doubling sleep, 100 times
  by default: on a truncated or damaged file that is hours of sleeping. METADATA_READ_ATTEMPTS
  keeps the whole back-off near 0.1 s, long enough for a live writer to finish a flush.
- `check_contents` refuses what hpcrl never writes and what could make a small file ask for
  unbounded memory or reach outside itself: links other than hard links (an external link opens
  another file), datasets whose data lives elsewhere (external storage, virtual datasets), filters
  (hpcrl never compresses, and a filter can expand a few bytes into any amount), and datasets that
  declare more bytes than the file holds.

Errors are `RefusedFileError`, an OSError, so callers that report unreadable files (OSError from
h5py) report these too.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import os
import re
import stat
import time
from typing import Callable

import h5py

# What h5py raises on a damaged file, depending on where the damage is met: RuntimeError from its
# low-level calls ("incorrect metadata checksum", "message not aligned"), OSError from most others.
DAMAGE_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError)
# Sleeps double from 1 ns per attempt: 27 attempts sleep about 0.13 s in all before giving up.
METADATA_READ_ATTEMPTS = 27


class RefusedFileError(OSError):
    """An HDF5 file hpcrl will not read: not a regular file, or content that could make reading
    it hang, reach outside the file or use unbounded memory."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def _set_metadata_read_attempts() -> Callable[[int, int], int]:
    """HDF5's H5Pset_metadata_read_attempts, which h5py does not wrap, from the HDF5 library h5py
    itself is linked against (a symbol looked up in an extension module is found in the
    libraries it loaded), so the property list ids agree."""
    function = ctypes.CDLL(h5py.h5p.__file__).H5Pset_metadata_read_attempts
    function.argtypes, function.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
    return function


_set_attempts = _set_metadata_read_attempts()

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def check_regular(path: str) -> None:
    """RefusedFileError unless `path` is a regular file or a link to one (FileNotFoundError if
    there is nothing there)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise RefusedFileError(path, f"is {kind}, not a regular file; hpcrl reads run-directory files only from "
                                     f"regular files: remove it or put the real file there")


def open_for_reading(path: str, swmr: bool = False) -> h5py.File:
    """`path` opened read-only, bounded in time: a regular file only, metadata reads retried at
    most METADATA_READ_ATTEMPTS times. `swmr`: as an SWMR reader, for a file a run may still be
    writing (or one a killed writer left flagged as open). Pair with `check_contents` before
    reading data."""
    check_regular(path)
    try:
        return _open_read_only(path, swmr, lock=False)
    except OSError as exc:
        if "locking flag" not in str(exc):
            raise
        # this process has the file open already (it writes it), with HDF5's lock: a second
        # handle must ask for the same, and shares the first one's lock anyway
        return _open_read_only(path, swmr, lock=True)


def _open_read_only(path: str, swmr: bool, lock: bool) -> h5py.File:
    """`path` opened read-only. Without `lock`, HDF5 takes no shared lock on it: a reader polling
    a run's metrics.h5 must never make that run's writer fail to open it (HDF5 refuses a writer
    while any reader holds the lock, and does not wait)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    if swmr:
        fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    if not lock and hasattr(fapl, "set_file_locking"):  # (h5py built on HDF5 >= 1.10.7 / 1.12.1)
        fapl.set_file_locking(False, True)
    if _set_attempts(fapl.id, METADATA_READ_ATTEMPTS) < 0:
        raise RuntimeError("HDF5 refused H5Pset_metadata_read_attempts")
    flags = h5py.h5f.ACC_RDONLY | (h5py.h5f.ACC_SWMR_READ if swmr else 0)
    return h5py.File(h5py.h5f.open(os.fsencode(path), flags, fapl=fapl))


def open_for_writing(path: str, mode: str, wait_s: float = 60.0, **kwargs) -> h5py.File:
    """h5py.File(path, mode, ...) that waits up to `wait_s` for HDF5's file lock. HDF5 fails at
    once when another process holds it: hpcrl's own readers take none, but h5dump, h5py or
    HDFView in someone's session do, and a resuming run must not die of a short look at its
    metrics. OSError naming the file if the lock stays taken."""
    deadline, pause = time.monotonic() + wait_s, 0.01
    while True:
        try:
            return h5py.File(path, mode, **kwargs)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OSError(errno.EAGAIN, f"{path}: another process holds HDF5's lock on it (an h5py, h5dump or "
                                            f"HDFView session reading it?) and has not let go for {wait_s:.0f} s; "
                                            f"close that reader and start again") from None
            time.sleep(pause)
            pause = min(2 * pause, 1.0)


@contextlib.contextmanager
def writes_fail_as_os_errors(path: str):
    """HDF5 writes to `path` whose failures all reach the caller as OSError. h5py raises most failed
    writes as OSError, but one met while it flushes, closes or frees an object (a full disk when the
    file's last blocks go out) as RuntimeError, with the C errno only in its text ("... errno = 28,
    error message = 'No space left on device' ..."), and closing the file after it may raise a
    second RuntimeError that hides the first ("Can't destroy cache")."""
    try:
        yield
    except RuntimeError as exc:
        cause: BaseException | None = exc
        while cause is not None and not (found := re.search(r"errno = (\d+)", str(cause))):
            cause = cause.__context__
        if cause is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), path) from exc


def check_contents(f: h5py.File, path: str, written_whole: bool) -> None:
    """RefusedFileError naming the object unless every link in `f` is a hard link and every
    dataset holds its own uncompressed data, no more than the file's size, and all of them
    together no more than that either. `written_whole`: the file was closed after all its data
    was written (checkpoints), so each dataset must also have all its bytes stored; a file still
    being written (metrics.h5) may have grown a dataset before writing its rows."""
    file_bytes = os.path.getsize(path)
    total = 0
    links: list[tuple[str, int]] = []  # gathered first: h5py's visit cannot pass an exception through
    f.id.links.visit(lambda name, info: links.append((name.decode(errors="replace"), info.type)), info=True)
    for name, link_type in links:
        if link_type != h5py.h5l.TYPE_HARD:
            kind = "a soft link" if link_type == h5py.h5l.TYPE_SOFT else "an external link"
            raise RefusedFileError(path, f"/{name} is {kind}; hpcrl writes only hard links, and a link could "
                                         f"lead outside the file")
    for name, _ in links:
        item = f[name]
        if not isinstance(item, h5py.Dataset):
            continue
        dcpl = item.id.get_create_plist()
        if item.is_virtual or dcpl.get_external_count():
            raise RefusedFileError(path, f"dataset /{name} keeps its data outside the file; hpcrl never writes such")
        if dcpl.get_nfilters():
            raise RefusedFileError(path, f"dataset /{name} is compressed or filtered; hpcrl never writes such")
        declared = math.prod(item.shape or ()) * item.dtype.itemsize  # exact: a crafted shape may overflow int64
        stored = item.id.get_storage_size()
        if declared > file_bytes or (written_whole and stored < declared):
            raise RefusedFileError(path, f"dataset /{name} declares {declared:,} bytes ({item.shape} of "
                                         f"{item.dtype}) but the file stores {stored:,} bytes of it and holds "
                                         f"{file_bytes:,} bytes in all: the file is damaged")
        total += declared
        if total > file_bytes:
            raise RefusedFileError(path, f"its datasets declare {total:,} bytes up to /{name}, more than the "
                                         f"file's {file_bytes:,} bytes: the file is damaged")


def unlink_if_link(path: str) -> None:
    """Remove a symbolic link at `path` (its target untouched), so that the file hpcrl creates
    there next is a new one of its own instead of being written through the link."""
    if os.path.islink(path):
        os.unlink(path)
