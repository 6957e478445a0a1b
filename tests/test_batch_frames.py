"""algo.batch_frames: real mpirun jobs (1 learner, 1 inference, 2 env ranks; fragments of
16 steps x 4 envs = 64 frames) train on exactly batch_frames frames per update."""
import numpy as np

from tests.conftest import mpirun, small_config, write_config
from tests.test_cli import hpcrl
from tests.test_mpi_runs import check_finished

F = 16 * 4  # frames per fragment in small_config


def test_sync_batch_of_two_fragments_per_env_rank_all_of_the_trained_version(tmp_path):
    batch = 2 * 2 * F  # 2 env ranks x 2 fragments
    cfg = small_config(tmp_path, algo={"mode": "sync", "batch_frames": batch}, run={"total_frames": 5 * batch})
    m = check_finished(mpirun(4, "run", str(write_config(tmp_path, cfg))), cfg, 5 * batch)
    assert m["frames"][0] == batch and np.all(np.diff(m["frames"]) == batch)
    # each env rank collected both its fragments with the version the update trained, then waited
    assert np.all(m["sample_version_min"] == m["policy_version"] - 1)
    assert np.all(m["sample_version_max"] == m["policy_version"] - 1)
    assert np.all(m["sample_slots_max"] <= 2 * 2 + 2)  # default: a batch plus one slot per env rank


def test_async_batch_of_three_fragments_from_two_env_ranks(tmp_path):
    batch = 3 * F  # not a multiple of the 2 env ranks: fragments are taken in arrival order
    cfg = small_config(tmp_path, algo={"mode": "async", "batch_frames": batch, "max_policy_lag": 1000},
                       run={"total_frames": 6 * batch})
    m = check_finished(mpirun(4, "run", str(write_config(tmp_path, cfg))), cfg, 6 * batch, sync=False)
    assert np.all(m["fragments_dropped"] == 0)  # so every frame counted was trained on
    assert m["frames"][0] == batch and np.all(np.diff(m["frames"]) == batch)
    assert np.all(m["sample_slots_max"] <= 3 + 2)


def test_run_and_plan_refuse_a_batch_that_is_not_whole_fragments_per_env_rank_alike(tmp_path):
    cfg = small_config(tmp_path, algo={"mode": "sync", "batch_frames": 3 * F})  # 2 env ranks: 1.5 each
    path = str(write_config(tmp_path, cfg))
    run = mpirun(4, "run", path)
    plan = hpcrl("plan", path, "--world-size", "4")
    assert run.returncode == plan.returncode == 2, run.stdout + run.stderr
    error = [line for line in run.stderr.splitlines() if line.startswith("hpcrl: config error:")]
    assert error == [plan.stderr.strip()], run.stderr
    assert "algo.batch_frames: 192 frames are not a whole number of fragments per env rank" in error[0]
    assert "a multiple of 2 x 64 = 128 (nearest: 128 or 256" in error[0]
    assert not (tmp_path / "runs").exists()  # refused before anything was written
