"""DQN as real jobs: two learners with their own replay shards stay bit-identical, the replay
ratio holds, the checkpoint carries the target network, and a resume refills the replay."""
import json
import subprocess
import sys

import numpy as np
import pytest

from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from tests.conftest import REPO, mpirun, run_dir, small_config, write_config
from tests.test_mpi_runs import check_finished

GRADIENT_STEPS = 4


def dqn_config(tmp_path, **sections):
    algo = {"name": "dqn", "rollout_length": 8, "lr": 0.001,
            "dqn": {"batch_size": 32, "gradient_steps": GRADIENT_STEPS, "target_update_interval": 10,
                    "eps_schedule": "linear", "eps_decay_frames": 2000},
            "replay": {"capacity": 100_000, "warmup": 512, "replay_ratio": 4}}
    cfg = small_config(tmp_path, **sections)
    cfg["algo"] = {**algo, **sections.get("algo", {})}
    return cfg


def test_two_learners_with_their_own_replay_shards_stay_bit_identical(tmp_path):
    cfg = dqn_config(tmp_path, run={"replica_digests": True, "total_frames": 4096},
                     roles={"learner": {"ranks": 2}, "inference": {"ranks": 1}, "env": {"ranks": "rest"}})
    result = mpirun(5, "run", str(write_config(tmp_path, cfg)))
    metrics = check_finished(result, cfg, 4096, sync=False)
    digests = metrics["replica_digest"]
    assert np.all(digests[:, 0] == digests[:, 1])  # same averaged gradients, same target copies
    assert len(set(digests[:, 0])) == len(digests)
    # the replay holds every transition (capacity is larger than the run); each env step makes one,
    # except the last few of each env's window, still waiting for their n steps
    envs = 2 * 4
    assert np.all(metrics["replay_size"] <= metrics["frames"])
    assert metrics["replay_size"][-1] >= metrics["frames"][-1] - 2 * envs * (3 + 1) - 2 * 8 * envs
    assert metrics["replay_size"][0] >= 512  # nobody trains before the warm-up is in
    # the learners keep the replay ratio: at most one update of samples (and one record) ahead of it
    ratio = metrics["replay_ratio"][-1]
    assert 2.0 < ratio <= 4.0 + 1e-9
    assert np.all(metrics["eps_max"] <= 1.0) and metrics["eps_min"][-1] == pytest.approx(0.05)
    ck = load_checkpoint(str(run_dir(cfg) / "checkpoint.h5"))
    step = ck["parts"]["step"]
    assert int(step["gradient_steps"]) == GRADIENT_STEPS * metrics["policy_version"][-1]
    assert set(step["target"]) == set(ck["model"])  # the target network, saved beside the model


@pytest.mark.parametrize("save_replay", [False, True], ids=["replay-refilled", "replay-saved"])
def test_serial_dqn_resumes_its_counters_and_target_and_its_replay_if_saved(tmp_path, save_replay):
    cfg = dqn_config(tmp_path, roles={"inference": {"ranks": 0}}, run={"total_frames": 2048})
    cfg["algo"]["replay"]["checkpoint"] = save_replay
    first = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    before = check_finished(first, cfg, 2048, sync=False)
    assert (run_dir(cfg) / "replay-0.h5").exists() == save_replay
    cfg["run"]["total_frames"] = 4096
    second = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    after = check_finished(second, cfg, 4096, sync=False)
    assert "resuming from" in second.stdout
    n = len(before["frames"])
    np.testing.assert_array_equal(after["frames"][:n], before["frames"])  # the first run's rows stay
    new_frames = after["frames"][n] - before["frames"][-1]
    if save_replay:  # the shard is back: training goes on at once, on the old transitions and the new
        assert new_frames < 512
        assert after["replay_size"][n] >= before["replay_size"][-1] + new_frames - 4 * 4 * 4
    else:  # without a saved replay the resumed run takes in a warm-up's worth again before it trains
        assert new_frames >= 512 and "fills its replay again" not in second.stdout
        assert after["replay_size"][n] < new_frames + 4 * 8 * 4
    ck = load_checkpoint(str(run_dir(cfg) / "checkpoint.h5"))
    assert int(ck["parts"]["step"]["gradient_steps"]) == GRADIENT_STEPS * after["policy_version"][-1]


def test_a_saved_replay_of_another_learner_count_is_not_used_and_the_run_says_so(tmp_path):
    cfg = dqn_config(tmp_path, roles={"learner": {"ranks": 2}, "inference": {"ranks": 0}}, run={"total_frames": 1024})
    cfg["algo"]["replay"]["checkpoint"] = True
    check_finished(mpirun(4, "run", str(write_config(tmp_path, cfg))), cfg, 1024, sync=False)
    assert (run_dir(cfg) / "replay-0.h5").exists() and (run_dir(cfg) / "replay-1.h5").exists()
    cfg["roles"]["learner"]["ranks"] = 1
    cfg["run"]["total_frames"] = 2048
    second = mpirun(3, "run", str(write_config(tmp_path, cfg)))
    check_finished(second, cfg, 2048, sync=False)
    assert "learner 0: no saved replay shard to resume from" in second.stdout
    assert "holds policy version" in second.stdout and "of 2 learners" in second.stdout


def test_dqn_is_refused_for_continuous_actions_before_any_rank_starts_work(tmp_path):
    cfg = dqn_config(tmp_path, env={"id": "Pendulum-v1"}, roles={"inference": {"ranks": 0}})
    result = mpirun(2, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "dqn needs a Discrete action space" in result.stderr and "use algo.name: ppo" in result.stderr


def test_metrics_name_what_a_dqn_run_reports(tmp_path):
    cfg = dqn_config(tmp_path, roles={"inference": {"ranks": 0}}, run={"total_frames": 1024})
    check_finished(mpirun(1, "run", str(write_config(tmp_path, cfg))), cfg, 1024, sync=False)
    metrics = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    for key in ("replay_size", "replay_ratio", "priority_mean", "td_error", "q_mean", "eps_min", "eps_max", "beta"):
        assert np.all(np.isfinite(metrics[key])), key
    assert np.all(np.diff(metrics["beta"]) >= 0) and 0.4 <= metrics["beta"][0] < metrics["beta"][-1] <= 1.0
    # hpcrl eval plays the Q-network greedily, sampled or not (exploration belongs to the actors)
    played = subprocess.run([sys.executable, "-m", "hpcrl", "eval", str(run_dir(cfg)), "--episodes", "2", "--json"],
                            capture_output=True, text=True, cwd=REPO)
    assert played.returncode == 0, played.stderr
    assert json.loads(played.stdout)["episodes"] == 2


def test_the_shipped_atari_apex_job_trains_on_frame_stacks_with_per_env_epsilons(tmp_path):
    """jobs/breakout_apex.yaml, cut short: uint8 frame stacks travel in transitions, the Nature CNN
    with its dueling head trains on them, and every env explores with its own Ape-X epsilon."""
    out = tmp_path / "runs"
    result = mpirun(4, "run", str(REPO / "jobs" / "breakout_apex.yaml"), "--set", f"run.output_dir={out}",
                    "--set", "run.total_frames=2000", "--set", "algo.replay.warmup=800",
                    "--set", "algo.replay.capacity=5000", timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    metrics = read_metrics(str(out / "breakout_apex" / "metrics.h5"))
    assert metrics["frames"][-1] >= 2000 and metrics["replay_size"][0] >= 800
    # 2 env ranks x 8 envs: eps from 0.4 down to 0.4 ** 8
    assert metrics["eps_max"][-1] == pytest.approx(0.4) and metrics["eps_min"][-1] == pytest.approx(0.4 ** 8)
    assert np.all(np.isfinite(metrics["td_error"])) and np.all(np.isfinite(metrics["q_mean"]))
    ck = load_checkpoint(str(out / "breakout_apex" / "checkpoint.h5"))
    assert any(k.startswith("trunk.0.") for k in ck["parts"]["step"]["target"])  # the CNN's target copy
