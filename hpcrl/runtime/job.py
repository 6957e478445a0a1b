"""The whole job, where a population cuts it into members: each member's run lives on
its own block of ranks (a communicator split from the job's, passed to everything of its run),
and these few collectives over every rank of the job keep the members in step where they must
agree: at start-up, every member's verdict (one refusal stops them all, with one message), and at
the end, a sleeping barrier before MPI_Finalize.

Open MPI's MPI_Finalize waits for every process of the job, polling every 100 us: members that
stop early would take a share of the cores from the members still training. The barrier here
sleeps instead.
"""
from __future__ import annotations

from mpi4py import MPI

from hpcrl.runtime.comm import JOB, wait_sleeping

FINISH_SLEEP_S = 0.05  # between tests of the end-of-job barrier: a member waits there for seconds or hours


def job_rank() -> int:
    return JOB.Get_rank()


def job_size() -> int:
    return JOB.Get_size()


def split(color: int | None, key: int):
    """Collective over the job: the communicator of the ranks with this `color` (None: none,
    and None is returned), ordered by `key`."""
    sub = JOB.Split(MPI.UNDEFINED if color is None else color, key)
    return None if color is None else sub


def agree(verdict: dict) -> dict:
    """Collective over the job: the first member's verdict that holds an error, else this rank's
    own (after a sleeping barrier: members reach this at different times)."""
    wait_sleeping(JOB.Ibarrier())
    errors = [v for v in JOB.allgather(verdict if "error" in verdict else None) if v is not None]
    return errors[0] if errors else verdict


def broadcast(obj, root: int = 0):
    """Collective over the job: `root`'s object on every rank (after a sleeping barrier)."""
    wait_sleeping(JOB.Ibarrier())
    return JOB.bcast(obj, root=root)


def gather(obj, root: int = 0) -> list | None:
    """Collective over the job: every rank's object in a list on `root`, None elsewhere (after a
    sleeping barrier)."""
    wait_sleeping(JOB.Ibarrier())
    return JOB.gather(obj, root=root)


def any_of(flag: bool) -> bool:
    """Collective over the job: whether `flag` holds on any rank (after a sleeping barrier, so
    also a barrier that sleeps)."""
    wait_sleeping(JOB.Ibarrier())
    return any(JOB.allgather(bool(flag)))


def wait_for_every_member() -> None:
    """Collective over the job: a sleeping barrier, so no finished member polls in MPI_Finalize."""
    wait_sleeping(JOB.Ibarrier(), FINISH_SLEEP_S)
