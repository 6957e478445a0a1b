"""Double-buffered env ranks: with two env groups, one steps while the other waits for actions."""
import numpy as np
import pytest

from hpcrl.io.metrics import read_metrics
from tests.conftest import mpirun, run_dir, small_config, write_config


def wait_fraction(tmp_path, groups: int) -> float:
    # a slow env (2 ms per env step) and async mode, so env ranks wait only for inference replies
    cfg = small_config(tmp_path, name=f"groups{groups}", run={"total_frames": 2048},
                       env={"id": "tests.instrumented_envs:HpcrlTest/Slow-v0", "num_envs": 4, "groups": groups,
                            "kwargs": {"step_seconds": 0.002}},
                       algo={"mode": "async"},
                       roles={"learner": {"ranks": 1}, "inference": {"ranks": 1}, "env": {"ranks": 1}})
    result = mpirun(3, "run", str(write_config(tmp_path, cfg, f"groups{groups}.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert metrics["frames"][-1] >= 2048
    return float(np.mean(metrics["env_wait_fraction"]))


@pytest.mark.alone  # a ratio of measured waits
def test_two_env_groups_hide_the_inference_round_trip(tmp_path):
    one, two = wait_fraction(tmp_path, 1), wait_fraction(tmp_path, 2)
    assert one > 0.0  # with a single vector the env rank idles for every reply
    assert two < 0.5 * one, (one, two)


def test_groups_must_divide_num_envs(tmp_path):
    cfg = small_config(tmp_path, env={"num_envs": 4, "groups": 3})
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2
    assert "env.groups: expected a divisor of env.num_envs (4) such as 1, 2, 4, got 3" in result.stderr
