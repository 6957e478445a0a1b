"""The parameter stream: newest-only, hierarchical (root -> node leaders -> node holders through
shared memory), and a slow holder never slows the learner."""
import json

import numpy as np
import pytest

from hpcrl.io.metrics import read_metrics
from tests.conftest import mpirun, mpirun_script, run_dir, small_config, write_config


def test_every_holder_gets_the_newest_versions_and_the_stop_word_through_a_tree_of_node_leaders(tmp_path):
    # 7 ranks on 4 synthetic nodes: the root alone on node 0, two holders on each other node
    # (leaders 1, 3, 5 in a tree under the root; 2, 4, 6 read their node's shared window); 6 is slow
    nodes, slow = "0,1,1,2,2,3,3", 6
    result = mpirun_script(7, "mpi_param_tree.py", str(tmp_path), nodes, str(slow))
    assert result.returncode == 0, result.stdout + result.stderr
    records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(1, 7)}
    for rank, record in records.items():
        seen = record["versions"]
        assert record["torn"] == 0, rank  # the sequence lock never hands out a half-written copy
        assert seen[-1] == 301 and np.all(np.diff(seen) > 0), (rank, seen[-5:])  # newest only, stop last
    assert len(records[slow]["versions"]) < 301  # the slow holder skipped versions instead of queueing them


@pytest.mark.alone  # a ratio of updates to a slow holder's steps, both paced by the wall clock
def test_a_slow_policy_holder_does_not_set_the_learners_pace(tmp_path):
    """Async, inline inference: every env rank holds the policy; one sleeps 0.2 s per env step.
    With one broadcast per version the learner would wait for it at every update."""
    report = tmp_path / "slow_steps.txt"
    cfg = small_config(tmp_path, run={"total_frames": 4800, "log_interval_s": 60},
                       roles={"learner": {"ranks": 1}, "inference": {"ranks": 0}, "env": {"ranks": "rest"}},
                       env={"id": "tests.instrumented_envs:HpcrlTest/SlowOnOneRank-v0", "num_envs": 2,
                            "kwargs": {"slow_rank": 3, "step_seconds": 0.2, "report": str(report)}},
                       algo={"mode": "async", "rollout_length": 8, "epochs": 2, "max_policy_lag": 1000})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    updates = len(read_metrics(str(run_dir(cfg) / "metrics.h5"))["frames"])
    slow_steps = sum(int(line) for line in report.read_text().split())  # each of its envs counts its steps
    slow_steps //= 2
    assert updates > 3 * slow_steps, (updates, slow_steps)
