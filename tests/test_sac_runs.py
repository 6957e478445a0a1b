"""SAC and TD3 as real jobs: 4 ranks with a policy server whose env ranks never import torch, two
learners that stay bit-identical, hpcrl eval of the deterministic policy within the env's bounds,
and the refusal of a Discrete env before any rank starts work."""
import json
import subprocess
import sys

import numpy as np
import pytest

from hpcrl.io.checkpoint import load_checkpoint
from tests.conftest import REPO, mpirun, run_dir, small_config, write_config
from tests.test_mpi_runs import check_finished


def sac_config(tmp_path, name: str = "sac", **sections):
    algo = {"name": name, "rollout_length": 8, "lr": 0.001,
            "sac": {"batch_size": 64, "gradient_steps": 4, "learning_starts": 256},
            "replay": {"capacity": 10_000, "replay_ratio": 16}}
    sections["env"] = {"id": "Pendulum-v1", "num_envs": 2, **sections.get("env", {})}
    cfg = small_config(tmp_path, **sections)
    cfg["algo"] = {**algo, **sections.get("algo", {})}
    return cfg


def test_sac_on_4_ranks_with_a_policy_server_keeps_env_ranks_torch_free_and_plays_in_eval(tmp_path):
    report = tmp_path / "modules"
    report.mkdir()
    cfg = sac_config(tmp_path, run={"total_frames": 1536},
                     env={"id": "tests.instrumented_envs:HpcrlTest/ModuleReportingPendulum-v0",
                          "kwargs": {"report_dir": str(report)}, "num_envs": 2})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    metrics = check_finished(result, cfg, 1536, sync=False)
    by_rank = {}
    for path in report.iterdir():
        by_rank.setdefault(path.name.split("-")[0], []).append(path.read_text())
    assert by_rank["rank2"] == [""] and by_rank["rank3"] == [""]  # env ranks: neither torch nor horovod
    for key in ("critic_loss", "actor_loss", "q_mean", "alpha", "td_error", "replay_size", "replay_ratio"):
        assert np.all(np.isfinite(metrics[key])), key
    assert metrics["replay_size"][0] >= 256  # nobody trains before the warm-up (learning_starts) is in
    assert 8.0 < metrics["replay_ratio"][-1] <= 16.0 + 1e-9  # held by credits, one update ahead at most
    assert np.all(metrics["alpha"] > 0) and metrics["alpha"][-1] < 1.0  # tuned down from 1 towards -|A|
    ck = load_checkpoint(str(run_dir(cfg) / "checkpoint.h5"))
    assert int(ck["parts"]["step"]["gradient_steps"]) == 4 * metrics["policy_version"][-1]
    assert set(ck["parts"]["step"]["target"]) == set(ck["model"])  # the target networks, saved beside
    played = subprocess.run([sys.executable, "-m", "hpcrl", "eval", str(run_dir(cfg)), "--episodes", "2",
                             "--deterministic", "--json", "--trust-env-code"], capture_output=True, text=True, cwd=REPO)
    assert played.returncode == 0, played.stderr
    out = json.loads(played.stdout)
    assert out["episodes"] == 2 and out["lengths"] == [200, 200] and out["deterministic"]


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_two_learners_stay_bit_identical(tmp_path, name):
    """Their own replay shards, the same averaged gradients: the same weights, targets and (TD3)
    delayed actor updates, whose skipped gradients every learner drops alike."""
    cfg = sac_config(tmp_path, name, run={"replica_digests": True, "total_frames": 1536},
                     roles={"learner": {"ranks": 2}, "inference": {"ranks": 1}, "env": {"ranks": "rest"}},
                     algo={"name": name, "sac": {"batch_size": 64, "gradient_steps": 3, "learning_starts": 256,
                                                 "policy_delay": 2 if name == "td3" else 1}})
    metrics = check_finished(mpirun(5, "run", str(write_config(tmp_path, cfg))), cfg, 1536, sync=False)
    digests = metrics["replica_digest"]
    assert np.all(digests[:, 0] == digests[:, 1])
    assert len(set(digests[:, 0])) == len(digests)


def test_sac_is_refused_for_discrete_actions_before_any_rank_starts_work(tmp_path):
    cfg = sac_config(tmp_path, env={"id": "CartPole-v1"}, roles={"inference": {"ranks": 0}})
    result = mpirun(2, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "sac needs a Box (continuous) action space" in result.stderr and "use algo.name: dqn or ppo" in result.stderr


def test_hpcrl_tune_models_sac_as_it_models_dqn(tmp_path):
    """Measured costs (a gradient step by rows, a record's insert), a layout that keeps
    algo.sac.batch_size and the replay ratio, written as a config that validates."""
    from hpcrl.core.config import parse_config
    from tests.conftest import run_hpcrl
    out = tmp_path / "sac.yaml"
    tuned = run_hpcrl("tune", str(REPO / "jobs/pendulum_sac.yaml"), "--ranks-per-node", "4", "--budget-s", "2",
                      "--no-averaging-measure", "-o", str(out))
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    assert "gradient steps/s, replay ratio 256.00" in tuned.stdout and "insert" in tuned.stdout
    assert "algo.sac.batch_size 256" in tuned.stdout
    cfg = parse_config(out.read_text())
    assert cfg.algo.name == "sac" and cfg.algo.sac.batch_size == 256 and cfg.algo.replay.replay_ratio == 256
