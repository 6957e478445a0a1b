"""The parameter stream: each policy version from the learner root to every policy holder, newest
only and hierarchical, so a slow holder never delays the publisher or the learners.

Shape (built once by `build_parameter_stream`, collective over the run's world):
- the root and one leader per node (the lowest holder rank there) form a binary tree; each edge
  carries one version at a time: a sender starts a send to a child only once the child's previous
  send has completed, and then sends the newest version it has, skipping any in between;
- a leader writes each version it receives into an MPI-3 shared-memory window on its node, under
  a sequence lock, and the node's other holders copy the newest version out of it.
So the root's work per version is two sends whatever the number of holders, the tree is log-deep
in nodes, and no rank waits on a slow one: the root keeps a version pending while its buffers
are busy and sends the newest once one frees. In sync mode no version can be skipped, since the
learner cannot make version v+1 before every holder has served version v.

The last version carries the END flag, the stream's own goodbye, and is never skipped: nothing
follows it. (Why the run stops travels on the control stream, `control.py`; END only lets every
edge of this tree close with no message unmatched.) Closing is polled, never waited on: a holder
is `finished()` once it has END and, as a leader, has passed it on to its children.
Message buffers: a sender keeps (children + 2), so the newest version, the one being filled or
received, and one in flight per child each have their own.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from mpi4py import MPI

from hpcrl.core.messages import END, Message, MessageSpec
from hpcrl.runtime import traffic

PARAMS_TAG = 1
SEQ_BYTES = 8  # the shared window starts with the sequence word: odd while the leader writes


def tree_children(index: int, size: int) -> list[int]:
    """Children of tree node `index` (0 = the root) in a binary tree over `size` nodes."""
    return [c for c in (2 * index + 1, 2 * index + 2) if c < size]


class _Edges:
    """Newest-only sends from a pool of buffers to this tree node's children."""

    def __init__(self, comm, children: list[int], spec: MessageSpec, extra_buffers: int):
        self.comm = comm
        self.children = children
        self.pool = [spec.allocate() for _ in range(len(children) + extra_buffers)]
        self.newest: int | None = None  # pool index of the newest version held
        self.sending = {c: (MPI.REQUEST_NULL, -1) for c in children}  # child -> (request, pool index)
        self.sent_seq = {c: -1 for c in children}
        self.seq = -1  # arrival count of the newest version (versions repeat across resumes)
        self.remote = dict(zip(children, traffic.remote(comm, children)))

    def busy(self, i: int) -> bool:
        return i == self.newest or any(j == i for _, j in self.sending.values())

    def free_buffer(self, avoid: int | None = None) -> int | None:
        for i in range(len(self.pool)):
            if not self.busy(i) and i != avoid:
                return i
        return None

    def set_newest(self, i: int) -> None:
        self.newest = i
        self.seq += 1
        self.forward()

    def forward(self) -> None:
        """Start the newest version towards every child whose previous send has completed."""
        for child, (request, _) in self.sending.items():
            if request != MPI.REQUEST_NULL and not request.Test():
                continue
            if self.newest is not None and self.sent_seq[child] < self.seq:
                request = self.comm.Isend(self.pool[self.newest].buffer, dest=child, tag=PARAMS_TAG)
                if self.remote[child]:
                    traffic.count(traffic.WEIGHTS, self.pool[self.newest].buffer.nbytes)
                self.sending[child] = (request, self.newest)
                self.sent_seq[child] = self.seq
            else:
                self.sending[child] = (MPI.REQUEST_NULL, -1)

    def flushed(self) -> bool:
        self.forward()
        return all(r == MPI.REQUEST_NULL for r, _ in self.sending.values())


class ParameterPublisher:
    """The learner root's end: `publish(version, fill, flags)` never waits for any holder."""

    def __init__(self, tree_comm, spec: MessageSpec):
        size = 0 if tree_comm is None else tree_comm.Get_size()
        self.edges = _Edges(tree_comm, tree_children(0, size), spec, extra_buffers=2)
        self._pending: tuple | None = None  # (version, fill, flags, extra)

    @property
    def message(self) -> Message | None:
        """The newest published version (serial mode reads it in place)."""
        return None if self.edges.newest is None else self.edges.pool[self.edges.newest]

    def publish(self, version: int, fill: Callable[[np.ndarray], None], flags: int = 0,
                extra: Callable[[Message], None] | None = None) -> None:
        """Make `version` (the model as `fill` copies it now) the one to distribute; a version
        still waiting for a free buffer is replaced by this newer one. `extra` fills the message's
        other fields (a league member's slot: workers/league.py)."""
        self._pending = (version, fill, flags, extra)
        self.poll()

    def poll(self) -> None:
        self.edges.forward()  # reap completed sends first: their buffers may be free now
        if self._pending is not None:
            target = self.edges.free_buffer()
            if target is not None:
                version, fill, flags, extra = self._pending
                self._pending = None
                fill(self.edges.pool[target]["params"])
                if extra is not None:
                    extra(self.edges.pool[target])
                self.edges.pool[target].set(version=version, flags=flags)
                self.edges.set_newest(target)

    def flushed(self) -> bool:
        """At shutdown: the last version (END) has reached every child."""
        self.poll()
        return self._pending is None and self.edges.flushed()

    def wait(self) -> None:
        while not self.flushed():
            pass


class ParameterSubscriber:
    """A policy holder's end: `poll()` gives the newest version not seen yet, or None. A node's
    leader also receives from its tree parent, forwards to its children and fills the window."""

    def __init__(self, spec: MessageSpec, window, leader: bool, tree_comm=None, tree_index: int = 0):
        self.spec = spec
        self.window = window
        self.leader = leader
        self.copy = spec.allocate()  # what poll() hands out
        self.ended = False  # END is in: nothing more will come
        self._last_seq = 0
        buf, _ = window.Shared_query(0)
        shared = np.frombuffer(buf, dtype=np.uint8)
        self._seq = shared[:SEQ_BYTES].view(np.int64)
        self._shared = shared[SEQ_BYTES:SEQ_BYTES + spec.nbytes]
        window.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for the whole run: Sync() is the fence
        if leader:
            size = tree_comm.Get_size()
            self.edges = _Edges(tree_comm, tree_children(tree_index, size), spec, extra_buffers=2)
            self.parent = (tree_index - 1) // 2
            self._recv_into = 0
            self._recv = tree_comm.Irecv(self.edges.pool[0].buffer, source=self.parent, tag=PARAMS_TAG)
            self._seen_seq = -1

    def poll(self) -> Message | None:
        return self._poll_leader() if self.leader else self._read_window()

    def rearm(self) -> None:
        """Nothing to post: kept so policies use every subscriber alike."""

    def finished(self) -> bool:
        """END is in and, on a leader, has reached every child: the holder may close."""
        if not self.ended:
            self.poll()
        return self.ended and (not self.leader or self.edges.flushed())

    def close(self) -> None:
        """After `finished()`; a leader's receive is still posted only on an error path."""
        if self.leader and self._recv != MPI.REQUEST_NULL:
            self._recv.Cancel()
            self._recv.Wait()
        self.window.Unlock_all()

    def _poll_leader(self) -> Message | None:
        if self._recv != MPI.REQUEST_NULL and self._recv.Test():
            self._recv = MPI.REQUEST_NULL
            self.edges.set_newest(self._recv_into)
            self._write_window(self.edges.pool[self._recv_into])
        ended = self.edges.newest is not None and self.edges.pool[self.edges.newest].get("flags") & END
        if self._recv == MPI.REQUEST_NULL and not ended:  # nothing follows END
            target = self.edges.free_buffer()  # none while children hold every other buffer:
            if target is not None:  # then the parent's send waits, and it skips versions for us
                self._recv_into = target
                self._recv = self.edges.comm.Irecv(self.edges.pool[target].buffer, source=self.parent, tag=PARAMS_TAG)
        self.edges.forward()
        if self.edges.newest is None or self._seen_seq == self.edges.seq:
            return None
        self._seen_seq = self.edges.seq
        self.copy.buffer[...] = self.edges.pool[self.edges.newest].buffer
        self.ended = bool(self.copy.get("flags") & END)
        return self.copy

    def _write_window(self, message: Message) -> None:
        """Sequence lock: odd while writing, so a reader that sees it change retries."""
        self._seq[0] += 1
        self.window.Sync()
        self._shared[...] = message.buffer
        self.window.Sync()
        self._seq[0] += 1
        self.window.Sync()

    def _read_window(self) -> Message | None:
        self.window.Sync()
        seq = int(self._seq[0])
        if seq == self._last_seq or seq % 2:
            return None
        self.copy.buffer[...] = self._shared
        self.window.Sync()
        if int(self._seq[0]) != seq:
            return None  # the leader wrote meanwhile: read again on the next poll
        self._last_seq = seq
        self.ended = bool(self.copy.get("flags") & END)
        return self.copy


def build_parameter_stream(world, rank: int, root: int, holders: list[int], node_of_rank: np.ndarray,
                           spec: MessageSpec):
    """Collective over `world`: the publisher on the root, a subscriber on each holder, else None."""
    is_holder = rank in set(holders)
    member = rank == root or is_holder
    comm = world.Split(0 if member else MPI.UNDEFINED, 0 if rank == root else rank + 1)
    if not member:
        return None
    node = comm.Split(int(node_of_rank[rank]) if is_holder else MPI.UNDEFINED, rank)
    leader = is_holder and node.Get_rank() == 0
    tree = comm.Split(0 if rank == root or leader else MPI.UNDEFINED, 0 if rank == root else rank + 1)
    if rank == root:
        return ParameterPublisher(tree if tree.Get_size() > 1 else None, spec)
    window = MPI.Win.Allocate_shared(SEQ_BYTES + spec.nbytes if leader else 0, 1, comm=node)
    if leader:
        buf, _ = window.Shared_query(0)
        np.frombuffer(buf, dtype=np.uint8)[:SEQ_BYTES] = 0
    node.Barrier()  # the window is zeroed before anyone reads it
    return ParameterSubscriber(spec, window, leader, tree if leader else None, tree.Get_rank() if leader else 0)
