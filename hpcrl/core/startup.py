"""Where a process's start-up time goes: marks at the end of each phase, in seconds since the
process was created (exec), so the interpreter's own start and the imports count too.

One clock per process (`CLOCK`), marked by the code that ends each phase; a phase's time is its
mark minus the mark before it. Every rank ends start-up at its first piece of work: an env
rank's first env step, a policy server's first batch, a learner's first update. With `hpcrl run
--verbose` each rank prints its phases then, once; at the end of the run rank 0 gathers every
rank's marks into metrics.h5 (`startup_*` attributes; io/metrics.py).
"""
from __future__ import annotations

import gc
import importlib.machinery
import math
import os
import sys
import time

from hpcrl.core.say import say

# The marks, in the order a rank passes them (a rank passes those of its roles only).
MARKS = (
    "interpreter",  # Python is up and starts hpcrl (python -m hpcrl)
    "mpi_init",  # MPI_Init (importing mpi4py.MPI, with the few imports before it)
    "imports",  # the rest of hpcrl's modules and their libraries (numpy, yaml, gymnasium, ...)
    "checks",  # rank 0's config, env and model checks; every rank's layout and device checks
    "run_dir",  # the run directory locked and created (or the checkpoint to resume found)
    "roles",  # streams, models, envs and optimizers built; the first weights published
    "first_batch",  # a policy server answered its first batch of requests
    "first_step",  # an env rank stepped its envs for the first time (an action came back)
    "first_update",  # a learner finished its first update
)
# The mark that ends a role's start-up: the first piece of its real work.
FIRST_WORK = {"learner": "first_update", "inference": "first_batch", "env": "first_step"}


def _created() -> float:
    """This process's creation time on CLOCK_BOOTTIME's scale (Linux's /proc/self/stat field 22,
    in clock ticks since boot); where that is not available, now (the interpreter's start is then
    left out)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name in () may hold spaces
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return _now()


def _now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


class StartupClock:
    def __init__(self) -> None:
        self.created = _created()
        self.marks: dict[str, float] = {}
        self.verbose = False  # `hpcrl run --verbose`: print the phases once start-up ends
        self.label = ""  # "rank 3 (env)", once the rank's roles are known
        self.roles: tuple[str, ...] = ()
        self.printed = False

    def mark(self, name: str) -> None:
        """The end of phase `name` (one of MARKS), now; a phase ends once (later marks are ignored,
        so a loop may mark its first pass without a flag of its own)."""
        if name not in MARKS:
            raise ValueError(f"unknown start-up mark {name!r}; known: {', '.join(MARKS)}")
        if name in self.marks:
            return
        self.marks[name] = self.since_created()
        if self.verbose and not self.printed and self.roles and all(
                FIRST_WORK[role] in self.marks for role in self.roles):
            self.printed = True
            say(f"start-up of {self.label}: {self.describe()}")

    def since_created(self) -> float:
        return _now() - self.created

    def set_roles(self, label: str, roles: tuple[str, ...]) -> None:
        """This rank's roles: start-up ends when each has done its first piece of work."""
        self.label, self.roles = label, tuple(r for r in roles if r in FIRST_WORK)

    def phases(self) -> list[tuple[str, float]]:
        """(mark, seconds since the mark before it) for the marks passed, in MARKS order."""
        out, before = [], 0.0
        for name in MARKS:
            if name in self.marks:
                out.append((name, self.marks[name] - before))
                before = self.marks[name]
        return out

    def describe(self) -> str:
        """'interpreter 0.05 s, imports 0.41 s, ... (first_update at 3.90 s)'."""
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.phases())
        last = max(self.marks.values(), default=0.0)
        return f"{parts} (ready {last:.2f} s after exec)"

    def row(self) -> list[float]:
        """Seconds since exec at each of MARKS, NaN for a mark this rank never passed: the row
        that rank 0 gathers."""
        return [self.marks.get(name, math.nan) for name in MARKS]


CLOCK = StartupClock()


def pause_collection() -> None:
    """Start-up imports and builds objects that live as long as the process: after torch's import
    alone the collector tracks about 250,000 (its operator registrations, decompositions,
    dataclasses), and Python's cyclic collector, started every 700 new objects, walked them in
    about 380 collections and freed some 7,000. Paused from the first import until
    `resume_collection`, it costs a torch rank about 0.5 s of processor time less (15% of torch's
    import here)."""
    gc.disable()


def resume_collection() -> None:
    """The collector back once a rank's roles are built, with what start-up made frozen
    (gc.freeze): left out of every later collection, so the run's own collections, of the
    objects it makes and drops, do not walk torch's again each time. Once per process: a second
    run in it (a packed member's next turn, a script's next hpcrl.run) would freeze the last one's
    garbage for good (0.36 MiB a turn, measured)."""
    if not _FROZEN:
        gc.freeze()
        _FROZEN.append(True)
    gc.enable()


_FROZEN: list = []  # whether this process has frozen its start-up's objects


class WorkingDirectoryFinder:
    """The working directory as the import path's last entry, for a user's modules beside them
    (env.id my_envs:Maze, a scripted player my_players:greedy), listed once. Python's own finder
    for a directory stats it again on every import that reaches it, and every optional import
    that is found nowhere else does (34 on a learner at start-up): each one a call on the shared
    file system's metadata server, where the working directory lies. This one looks only for
    names listed there, and lists again when import caches are invalidated."""

    _LOADERS = ((importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
                (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
                (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES))

    def __init__(self, path: str) -> None:
        self.path = path
        self.invalidate_caches()

    def invalidate_caches(self) -> None:
        try:
            self._names = {entry.partition(".")[0] for entry in os.listdir(self.path)}
        except OSError:
            self._names = set()
        self._finder = None

    def find_spec(self, fullname: str, target=None):
        if fullname not in self._names:  # (the import path's entries find top-level names only)
            return None
        if self._finder is None:
            self._finder = importlib.machinery.FileFinder(self.path, *self._LOADERS)
        return self._finder.find_spec(fullname, target)


def find_modules_in_working_directory() -> None:
    """`python -m hpcrl` has the working directory on the import path; the `hpcrl` console
    script and `python -P` (a staged run: docs/clusters.md) would not. Appended, so it never
    shadows an installed module, and found by a `WorkingDirectoryFinder`."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)
        sys.path_importer_cache[cwd] = WorkingDirectoryFinder(cwd)
