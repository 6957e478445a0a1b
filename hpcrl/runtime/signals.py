"""Stop signals of `hpcrl run`: a request for a checkpoint and a clean exit, never a death.

SIGTERM (SLURM's time limit, preemption, `kill`), SIGUSR1 (`#SBATCH --signal=B:USR1@...`, which the
job scripts forward) and SIGINT (Ctrl-C) all mean the same: write a checkpoint at the next update,
then every rank exits with status 3 (EXIT_PREEMPTED). The first one counts; repeated signals are
ignored, so an impatient second Ctrl-C or a launcher that signals twice cannot kill the run
between the request and its checkpoint.

`install()` runs before the heavy imports (torch, mpi4py take most of a second), so a signal in
the first moments of a run is a request too, not a death. `ignore()` runs once the run has
returned its status: the interpreter resets Python's handlers to the default while it shuts down
(after MPI_Finalize, while torch unloads), and a late signal there used to turn a finished
checkpoint and status 3 into 143. Nothing here imports more than the standard library.
"""
from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

_received: list[int] = []  # every stop signal so far, the first one the request


def _handle(signum, frame) -> None:
    _received.append(signum)


def install() -> None:
    """Take over the stop signals: from now on each one is recorded, none kills the process."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handle)


def requested() -> bool:
    """Whether a stop signal has arrived (the run then checkpoints and exits 3)."""
    return bool(_received)


def first() -> str:
    """The name of the signal that asked for the stop ('SIGTERM'), or '' when none did."""
    return signal.Signals(_received[0]).name if _received else ""


def ignore() -> None:
    """The run has its exit status: later stop signals cannot change it any more."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
