"""What crosses a node: per stream, the messages and bytes this rank sent to ranks on other nodes.

Each stream end asks once, when it is built, which of its peers live on another node
(`remote`); each send to one of those adds to this process's table (`count`: two integer adds).
At the end of a run the launch sums every rank's `table` on rank 0 (`comm.sum_polled`), which
writes them to metrics.h5 and prints them, so a layout's node-aware claims (`hpcrl plan`'s "crossing nodes")
can be checked on the wire. Not counted: Horovod's gradient averages (its own traffic, which
`hpcrl plan` estimates) and the liveness heartbeats (a few bytes every 3 s per tree edge).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# the streams, in the order of the table's rows (and of metrics.h5's crossed_nodes attributes)
STREAMS = ("requests", "replies", "records", "credits", "weights", "control")
REQUESTS, REPLIES, RECORDS, CREDITS, WEIGHTS, CONTROL = range(len(STREAMS))

_table = np.zeros((len(STREAMS), 2), dtype=np.int64)  # [stream] -> (messages, bytes): this process's sends
_node_of_world_rank: np.ndarray | None = None
_world_group = None


def locate(world, node_of_world_rank: np.ndarray) -> None:
    """Which node each rank of `world` is on (once, at start-up, before any stream is built)."""
    global _node_of_world_rank, _world_group
    _node_of_world_rank = np.asarray(node_of_world_rank)
    _world_group = world.Get_group()
    _table[:] = 0


def remote(comm, peers: Sequence[int]) -> list[bool]:
    """For each peer (a rank of `comm`): is it on another node than this rank? All False before
    `locate` (a stream built outside `hpcrl run`, e.g. by a test script under mpirun)."""
    if _node_of_world_rank is None or comm is None or not len(peers):
        return [False] * len(peers)
    group = comm.Get_group()
    ranks = group.Translate_ranks([comm.Get_rank(), *peers], _world_group)
    group.Free()
    nodes = _node_of_world_rank[np.asarray(ranks)]
    return [bool(n != nodes[0]) for n in nodes[1:]]


def count(stream: int, nbytes: int) -> None:
    _table[stream, 0] += 1
    _table[stream, 1] += nbytes


def table() -> np.ndarray:
    """A copy of this process's counts: [stream] -> (messages, bytes)."""
    return _table.copy()


def describe(sums: np.ndarray) -> str:
    """'requests 0, ..., weights 40 (2,706,880 bytes), ...' for the run's last lines."""
    return ", ".join(f"{name} {int(messages):,} ({int(nbytes):,} bytes)" if messages else f"{name} 0"
                     for name, (messages, nbytes) in zip(STREAMS, sums))
