"""The control stream: the run's stop word, from the controller (the learner root) to every rank,
on a path of its own, independent of the weights and of any one policy.

Why a stream of its own: the stop word used to ride on the last weights version, so only policy
holders heard it directly, and every rank's way out depended on one policy's parameter stream. A
replay shard, a second policy's trainers or a self-play pool hold no copy of that policy; they
hear the stop word here like every other rank.

Shape: a tree over every rank, rooted at the controller: a binary tree of node leaders, and a
binary tree inside each node (`control_parents`), so only one edge per node crosses the network.
A word goes down the tree as one tiny int64 message per edge: each rank talks to its parent and
at most four children (O(1) peers), the depth is log-deep in nodes and in ranks per node, and the
controller sends at most four messages per word whatever the world size.

Protocol, on the stream's own communicator (a duplicate of the run's world; the tag is a local constant):
every rank but the controller keeps one receive posted from its parent. The stop word (its flags
say why: done, preempted, output failed) is the last word a rank receives; it forwards it to its
children and is finished once those sends complete. Every rank's poll loop keeps polling the
stream until then (`finished`), so no rank leaves while its subtree still waits for the word, and
no message is left unmatched.
"""
from __future__ import annotations

import enum

import numpy as np
from mpi4py import MPI

from hpcrl.core.messages import STOP
from hpcrl.runtime import traffic

CONTROL_WORDS = ("flags", "version")  # int64 words of one control message


class ControlTag(enum.IntEnum):
    WORD = 1


def control_parents(root: int, node_of_rank: np.ndarray) -> np.ndarray:
    """Each world rank's parent in the control tree (-1 for the root): a binary tree over one
    leader per node (the root leads its own node; elsewhere the lowest rank), and under each
    leader a binary tree over the rest of its node. Only leaders' edges cross nodes, a rank has at
    most 4 children, and the depth is about log2(nodes) + log2(ranks per node). Vectorised: the
    same answer on every rank, for 100,000 ranks in milliseconds."""
    node_of_rank = np.asarray(node_of_rank, dtype=np.int64)
    ranks = np.arange(len(node_of_rank), dtype=np.int64)
    order = np.lexsort((ranks, ranks != root, node_of_rank))  # by node, its leader first, then by rank
    nodes = node_of_rank[order]
    first = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]])  # where each node's block starts
    start = np.repeat(first, np.diff(np.r_[first, len(order)]))
    position = np.arange(len(order)) - start  # position inside the node's block (0: its leader)
    parent = np.full(len(order), -1, dtype=np.int64)
    inside = position > 0
    parent[order[inside]] = order[start[inside] + (position[inside] - 1) // 2]
    leaders = order[first]
    leaders = np.r_[root, leaders[leaders != root]]  # the root heads the tree of leaders
    parent[leaders[1:]] = leaders[(np.arange(1, len(leaders)) - 1) // 2]
    return parent


class ControlStream:
    """One rank's end of the control stream. The controller calls `stop(flags, version)`; every
    rank polls, reads `stop_flags` (0 until the stop word is in) and is `finished` once it has the
    word and has passed it on."""

    def __init__(self, comm, rank: int, parents: np.ndarray):
        """`parents`: every rank's parent (`control_parents`), the same array on every rank."""
        self.comm = comm
        self.rank = rank
        self.parent = None if parents[rank] < 0 else int(parents[rank])
        self.children = np.flatnonzero(parents == rank).tolist()
        self.stop_flags = 0
        self.version = -1  # the policy version the controller stopped at
        self._word = np.zeros(len(CONTROL_WORDS), dtype=np.int64)
        self._sends: list = []
        self._recv = (comm.Irecv(self._word, source=self.parent, tag=ControlTag.WORD)
                      if self.parent is not None else MPI.REQUEST_NULL)
        self._remote_children = sum(traffic.remote(comm, self.children))

    @property
    def neighbours(self) -> list[int]:
        """This rank's parent and children: the peers it watches (`liveness`)."""
        return ([] if self.parent is None else [self.parent]) + self.children

    @property
    def is_controller(self) -> bool:
        return self.parent is None

    @property
    def stopped(self) -> bool:
        return bool(self.stop_flags & STOP)

    def stop(self, flags: int, version: int) -> None:
        """Controller only: the run is over (`flags` say why); every rank hears it."""
        if not self.is_controller:
            raise RuntimeError(f"rank {self.rank} is not the controller of the control stream")
        if self.stopped:
            return
        self._word[:] = (flags | STOP, version)
        self._take_word()

    def poll(self) -> int:
        """Take the word if it has arrived (and pass it on); returns 1 if one did."""
        if self._recv == MPI.REQUEST_NULL or not self._recv.Test():
            return 0
        self._recv = MPI.REQUEST_NULL
        self._take_word()
        return 1

    def finished(self) -> bool:
        """The stop word is in and every child has it: this rank may leave."""
        self.poll()
        return self.stopped and MPI.Request.Testall(self._sends)

    def close(self) -> None:
        if self._recv != MPI.REQUEST_NULL:  # the run ended without a stop word (an error path)
            self._recv.Cancel()
            self._recv.Wait()
        MPI.Request.Waitall(self._sends)

    def _take_word(self) -> None:
        flags, version = (int(w) for w in self._word)
        self._sends = [self.comm.Isend(self._word, dest=child, tag=ControlTag.WORD) for child in self.children]
        for _ in range(self._remote_children):
            traffic.count(traffic.CONTROL, self._word.nbytes)
        self.stop_flags, self.version = flags, version


def build_control_stream(world, rank: int, root: int, node_of_rank: np.ndarray) -> ControlStream:
    """Collective over `world`: every rank's end of the control stream, rooted at `root`."""
    return ControlStream(world.Dup(), rank, control_parents(root, node_of_rank))
