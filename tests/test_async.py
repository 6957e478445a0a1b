"""Async mode (APPO with V-trace): real mpirun jobs. The learning test is in test_learning.py."""
import numpy as np

from tests.conftest import mpirun, small_config, write_config
from tests.test_mpi_runs import check_finished

ASYNC = {"mode": "async"}


def test_fragments_older_than_max_policy_lag_are_dropped_and_counted(tmp_path):
    # lag 0: a fragment begun before the learner's latest update is stale by the time it arrives
    cfg = small_config(tmp_path, algo={**ASYNC, "max_policy_lag": 0}, run={"total_frames": 4096})
    metrics = check_finished(mpirun(4, "run", str(write_config(tmp_path, cfg))), cfg, 4096, sync=False)
    assert metrics["fragments_dropped"][-1] > 0
    assert np.all(np.diff(metrics["fragments_dropped"]) >= 0)  # a running count
    assert np.all(metrics["policy_lag_max"] == 0)  # nothing older than allowed was trained on


def test_async_samples_span_several_policy_versions_within_the_lag(tmp_path):
    cfg = small_config(tmp_path, algo={**ASYNC, "max_policy_lag": 3}, run={"total_frames": 4096})
    metrics = check_finished(mpirun(4, "run", str(write_config(tmp_path, cfg))), cfg, 4096, sync=False)
    trained_on = metrics["policy_version"] - 1
    assert np.all(metrics["sample_version_max"] <= trained_on)
    assert np.all(trained_on - metrics["sample_version_min"] <= 3)
    assert np.all(metrics["policy_lag_max"] == trained_on - metrics["sample_version_min"])


def test_async_two_learners_stay_bit_identical(tmp_path):
    cfg = small_config(tmp_path, algo=ASYNC, run={"replica_digests": True, "total_frames": 4096},
                       roles={"learner": {"ranks": 2}, "inference": {"ranks": 1}, "env": {"ranks": "rest"}})
    metrics = check_finished(mpirun(6, "run", str(write_config(tmp_path, cfg))), cfg, 4096, sync=False)
    digests = metrics["replica_digest"]
    assert np.all(digests[:, 0] == digests[:, 1])
    assert len(set(digests[:, 0])) == len(digests)


def test_async_serial_and_inline_inference_runs(tmp_path):
    for ranks, roles in ((1, {}), (3, {"inference": {"ranks": 0}})):
        cfg = small_config(tmp_path, name=f"r{ranks}", algo=ASYNC, roles=roles)
        check_finished(mpirun(ranks, "run", str(write_config(tmp_path, cfg))), cfg, 2048, sync=False)
