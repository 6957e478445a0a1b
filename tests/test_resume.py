"""Preemption and resume through real mpirun jobs: exact continuation in serial mode, and a
signalled multi-rank run that resumes with a different number of env ranks."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from tests.conftest import MPIRUN, REPO, mpirun, run_dir, small_config, write_config

EXIT_PREEMPTED = 3


@pytest.mark.parametrize("normalize_reward, core", [(False, "none"), (True, "none"), (False, "lstm")])
def test_serial_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, normalize_reward, core):
    """With env.normalize_reward the trainer's reward scale (every env rank's return statistics)
    travels in the checkpoint: without it the resumed losses would differ. With a recurrent core,
    the env rows' hidden states travel in it too (episodes go on across the resume)."""
    algo, env = {"lr_schedule": "constant"}, {"normalize_reward": normalize_reward}
    model = {"core": core, "core_size": 16}
    whole = small_config(tmp_path, name="whole", run={"total_frames": 1280}, algo=algo, env=env, model=model)
    assert mpirun(1, "run", str(write_config(tmp_path, whole, "whole.yaml"))).returncode == 0
    halves = small_config(tmp_path, name="halves", run={"total_frames": 640}, algo=algo, env=env, model=model)
    path = str(write_config(tmp_path, halves, "halves.yaml"))
    assert mpirun(1, "run", path).returncode == 0
    second = mpirun(1, "run", path, "--set", "run.total_frames=1280")
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stdout and "policy version 10, 640 frames" in second.stdout

    a, b = read_metrics(str(run_dir(whole) / "metrics.h5")), read_metrics(str(run_dir(halves) / "metrics.h5"))
    for key in ("frames", "policy_version", "episodes", "return_mean", "return_window_mean", "loss_policy",
                "loss_value", "entropy"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)  # bit-identical, row for row
    ca, cb = load_checkpoint(str(run_dir(whole) / "checkpoint.h5")), load_checkpoint(str(run_dir(halves) / "checkpoint.h5"))
    for key in ca["model"]:
        assert torch.equal(ca["model"][key], cb["model"][key]), key
    saved = cb["extra"]["step"]
    assert ("reward_return_moments" in saved) == normalize_reward
    if normalize_reward:  # count: SB3's 1e-4 start plus one return per frame
        assert saved["reward_return_moments"][2] == pytest.approx(1280 + 1e-4)
        np.testing.assert_array_equal(saved["reward_return_moments"], ca["extra"]["step"]["reward_return_moments"])


def wait_for_rows(path, rows: int, proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if os.path.exists(path):
            try:
                if len(read_metrics(path).get("frames", [])) >= rows:
                    return
            except (OSError, KeyError):
                pass  # the writer is between creating the file and its first row
        time.sleep(0.2)
    raise AssertionError(f"{path} did not reach {rows} rows")


def test_sigusr1_checkpoints_and_exits_3_then_resume_with_more_env_ranks(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 10**7, "log_interval_s": 60})
    path = str(write_config(tmp_path, cfg))
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(["bash", str(MPIRUN), "-n", "4", sys.executable, "-m", "hpcrl", "run", path],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics_path = str(run_dir(cfg) / "metrics.h5")
    wait_for_rows(metrics_path, 3, proc)
    proc.send_signal(signal.SIGUSR1)  # what `scancel --signal=USR1` or `sbatch --signal=USR1@60` does
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED, out + err
    assert "preempted: checkpoint of policy version" in out and "Traceback" not in err
    saved = load_checkpoint(str(run_dir(cfg) / "checkpoint.h5"))["counters"]
    assert saved["stopped_by"] == "preempted"
    rows_before = read_metrics(metrics_path)
    assert rows_before["frames"][-1] == saved["frames"]

    # resume on 5 ranks: 3 env ranks instead of 2
    resumed = mpirun(5, "run", path, "--set", f"run.total_frames={saved['frames'] + 3 * 16 * 4 * 3}")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming from {run_dir(cfg) / 'checkpoint.h5'}" in resumed.stdout
    m = read_metrics(metrics_path)
    assert np.all(np.diff(m["policy_version"]) == 1)  # no gap, no repeat
    resumed_rows = m["frames"][len(rows_before["frames"]):]
    assert resumed_rows[0] == saved["frames"] + 3 * 16 * 4  # three env ranks' fragments per update now
    assert np.all(np.diff(resumed_rows) == 3 * 16 * 4)
    assert m["wall_time"][len(rows_before["frames"])] > rows_before["wall_time"][-1]  # wall time continues
