"""The control stream: the stop word reaches every rank through a node-aware tree, independent
of the weights; every rank talks to O(1) peers and only node leaders' edges cross nodes."""
import json

import numpy as np
import pytest

from hpcrl.core.layout import simulated_nodes
from hpcrl.core.messages import PREEMPTED, STOP
from hpcrl.runtime.control import control_parents
from tests.conftest import mpirun_script


def depth_of(parents: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parents), dtype=np.int64)
    for rank in range(len(parents)):
        r, d = rank, 0
        while parents[r] >= 0:
            r, d = parents[r], d + 1
            assert d <= len(parents), "a cycle in the control tree"
        depth[rank] = d
    return depth


@pytest.mark.parametrize("world, per_node, root", [(1000, 125, 0), (1000, 125, 997), (130, 64, 70), (1, 1, 0)])
def test_the_control_tree_spans_every_rank_with_few_peers_and_one_cross_node_edge_per_node(world, per_node, root):
    nodes = simulated_nodes(world, per_node)
    parents = control_parents(root, nodes)
    assert parents[root] == -1 and np.count_nonzero(parents < 0) == 1
    children = np.bincount(parents[parents >= 0], minlength=world)
    assert children.max(initial=0) <= 4  # with the parent: at most 5 peers, whatever the world size
    crossing = np.count_nonzero((parents >= 0) & (nodes[np.maximum(parents, 0)] != nodes))
    n_nodes = len(np.unique(nodes))
    assert crossing == n_nodes - 1  # one edge into every node but the root's
    depth = depth_of(parents)  # also: every rank reaches the root (no cycle, nobody cut off)
    assert depth.max() <= np.ceil(np.log2(n_nodes + 1)) + np.ceil(np.log2(per_node + 1))


def test_the_stop_word_reaches_every_rank_from_a_controller_off_rank_0(tmp_path):
    # 7 ranks on 3 synthetic nodes; the controller is rank 4 (as with roles.learner.place: high)
    nodes, root = "0,0,1,1,1,2,2", 4
    result = mpirun_script(7, "mpi_control_stream.py", str(tmp_path), nodes, str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(7)}
    for rank, record in records.items():
        assert record["flags"] == STOP | PREEMPTED and record["version"] == 42, (rank, record)
    assert records[root]["parent"] is None
    for rank, record in records.items():  # links agree on both ends
        for child in record["children"]:
            assert records[child]["parent"] == rank
    assert sum(len(r["children"]) for r in records.values()) == 6
