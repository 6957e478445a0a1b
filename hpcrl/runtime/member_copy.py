"""A population member's state copied from one learner group to another, in memory over MPI: no
files and no shared file system (population-based training's exploit step).

A member's state is a few arrays (hpcrl.models.member_arrays: the parameters' arena, the
normaliser statistics, Adam's three arenas) whose shapes both sides know already: the members of
a population build the same network and optimizer from the same config. So only the bytes
travel, one message per array, straight out of the source's tensors and straight into the
target's: the source's learner root sends, the target's learner root receives, then one broadcast
over the target's learners. Nothing is staged, packed or pickled on either side.

What was measured on the way (bench/population.py, a 10.8M-parameter actor-critic with its Adam
state, 130 MB, against one plain MPI.Send of as many bytes, about 11 ms here): one message over
every tensor at its address (an MPI hindexed datatype from MPI_BOTTOM) took 3.5x, since Open MPI
packs such a type in pieces; a message per tensor (36) 1.8-2.1x; the arenas, allocated by torch,
1.5x, since torch's memory is not on huge pages as numpy's is (models/arena.py); numpy-allocated
arenas with the waits below 1.0-1.07x.

Both sides must hold arrays of the same shapes, dtypes and order; `fingerprint` is a cheap check
of that, which the decider compares before asking for a copy.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.comm import wait_sleeping

MEMBER_COPY_TAG = 301  # point-to-point: source learner root -> target learner root, one message per array
# The sleep between tests while a copy's receiver waits for its source to begin: short, since a
# copy takes milliseconds (130 MB in about 11 ms here) and each sleep is added to it (with 2 ms
# sleeps a copy took 1.2-1.4x a plain send); long enough that the waiting rank leaves its core to
# the others (10,000 wake-ups a second at most).
PROBE_SLEEP_S = 1e-4


class MemberState:
    """The contiguous arrays of one member's state, which copies read and overwrite in place."""

    def __init__(self, arrays: list[np.ndarray], layout: str = ""):
        """`layout`: what the arrays hold, in words (hpcrl.models.member_layout: every tensor's
        name, shape and dtype), for `fingerprint`."""
        for i, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise ValueError(f"member state array {i} (shape {a.shape}) is not contiguous; "
                                 f"a copy would need a staging buffer")
        self.layout = layout
        self.arrays = [a for a in arrays if a.nbytes]  # nothing to send for an empty one
        self.nbytes = sum(a.nbytes for a in self.arrays)

    def fingerprint(self) -> str:
        """Layout, shapes, dtypes and order, hashed: equal on two members whose states can be
        copied one onto the other."""
        text = self.layout + "|" + ";".join(f"{a.dtype.str}{a.shape}" for a in self.arrays)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def send_state(comm, state: MemberState, dest: int) -> None:
    """Send this member's state to `dest` (the target group's learner root) on `comm`. The
    target is waiting for it (`receive_state`), so this waits without sleeping: the bytes move
    at once, and a sleep between the handshakes of the arrays made a copy 1.4-1.5x a plain send
    instead of 0.9-1.0x (bench/population.py)."""
    MPI.Request.Waitall([comm.Isend(a, dest=dest, tag=MEMBER_COPY_TAG) for a in state.arrays])


def receive_state(comm, state: MemberState, source: int) -> None:
    """Overwrite this member's state with the one `source` sends on `comm`. Sleeps between
    probes until the source has begun (it may be finishing an update, and a spinning wait would
    take the core it needs), then receives at full speed."""
    _probe_sleeping(comm, source, MEMBER_COPY_TAG)
    MPI.Request.Waitall([comm.Irecv(a, source=source, tag=MEMBER_COPY_TAG) for a in state.arrays])


def _probe_sleeping(comm, source: int, tag: int) -> None:
    """Sleep between probes until `source` has begun sending on `tag`."""
    while not comm.Iprobe(source=source, tag=tag):
        time.sleep(PROBE_SLEEP_S)


def broadcast_state(group_comm, state: MemberState, root: int = 0) -> None:
    """The root's state on every rank of `group_comm` (the target member's learners): the root
    sends at once; the others sleep between tests until the first array has come."""
    if group_comm.Get_size() == 1:
        return
    requests = [group_comm.Ibcast(a, root=root) for a in state.arrays]
    if group_comm.Get_rank() != root:
        wait_sleeping(requests[0], PROBE_SLEEP_S)
    MPI.Request.Waitall(requests)


REPORT_TAG = 302  # point-to-point: a member's learner root -> the population root (fitness, done)
ORDER_TAG = 303  # point-to-point: the population root -> a member's learner root (send, receive, farewell)
STEP_STATE_TAG = 304  # with a copy: the source's trainer-step state (a reward scale, a target network), pickled
POPULATION_ROOT = 0  # the population communicator's rank 0 decides (the first running member's learner root)


class PopulationChannel:
    """The small messages of a population, on a communicator of the running members' learner
    roots (rank i: member running[i]; every member, in order, unless a launch on too few ranks
    paused some): reports to the population root, its orders back. Messages and orders name
    members, and so do the copies' `send_state` and `receive_state` here. Every message is a
    float64 vector sent without waiting; the sends are kept until complete (`flushed`). Between
    one sender and one receiver MPI keeps the order, so a member serves its orders in the order
    the root issued them."""

    def __init__(self, comm, running: list[int] | None = None, members: int | None = None):
        self.comm = comm
        self.running = list(range(comm.Get_size())) if running is None else list(running)
        self.members = len(self.running) if members is None else members  # all of them, paused too
        self.member = self.running[comm.Get_rank()]
        self.is_root = comm.Get_rank() == POPULATION_ROOT
        self._rank = {m: i for i, m in enumerate(self.running)}
        self._sending: list = []

    def send_state(self, state: MemberState, member: int) -> None:
        """`send_state` to member `member`'s learner root."""
        send_state(self.comm, state, self._rank[member])

    def receive_state(self, state: MemberState, member: int) -> None:
        """`receive_state` from member `member`'s learner root."""
        receive_state(self.comm, state, self._rank[member])

    def _send(self, values, dest: int, tag: int) -> None:
        buf = np.ascontiguousarray(values, dtype=np.float64)
        self._sending = [(r, b) for r, b in self._sending if not r.Test()]
        self._sending.append((self.comm.Isend(buf, dest=dest, tag=tag), buf))

    def _received(self, tag: int, source: int = MPI.ANY_SOURCE) -> tuple[int, np.ndarray] | None:
        status = MPI.Status()
        if not self.comm.Iprobe(source=source, tag=tag, status=status):
            return None
        buf = np.empty(status.Get_count(MPI.DOUBLE), dtype=np.float64)
        self.comm.Recv(buf, source=status.Get_source(), tag=tag)
        return status.Get_source(), buf

    def report(self, values) -> None:
        self._send(values, POPULATION_ROOT, REPORT_TAG)

    def next_report(self) -> tuple[int, np.ndarray] | None:
        """(member, values) of a report that has arrived at the root, or None."""
        got = self._received(REPORT_TAG)
        return None if got is None else (self.running[got[0]], got[1])

    def order(self, member: int, values) -> None:
        self._send(values, self._rank[member], ORDER_TAG)

    def next_order(self) -> np.ndarray | None:
        got = self._received(ORDER_TAG, POPULATION_ROOT)
        return None if got is None else got[1]

    def send_step_state(self, state: dict, dest: int) -> None:
        """Small (a reward scale) or a network's worth (DQN's target); pickled, since MPI peers of
        one job are trusted (never anything read from a run directory)."""
        self.comm.send(state, dest=self._rank[dest], tag=STEP_STATE_TAG)

    def receive_step_state(self, source: int) -> dict:
        """The step state member `source` sends."""
        _probe_sleeping(self.comm, self._rank[source], STEP_STATE_TAG)
        return self.comm.recv(source=self._rank[source], tag=STEP_STATE_TAG)

    def flushed(self) -> bool:
        self._sending = [(r, b) for r, b in self._sending if not r.Test()]
        return not self._sending
