"""hpcrl as a library (hpcrl/tools/api.py, docs/python-api.md): configs checked with the command
line's messages, `import hpcrl` as light as before, a script of two runs in one 4-rank job
(jobs/sweep_lr.py) returning their statuses, and a run's checkpoint played from Python."""
import subprocess
import sys

import numpy as np
import pytest

import hpcrl
from hpcrl.io.metrics import read_metrics
from tests.conftest import MPIRUN, REPO, run_hpcrl, small_config, write_config


def test_a_config_from_a_file_or_a_dict_is_checked_with_the_command_lines_messages(tmp_path):
    cfg = hpcrl.Config.from_yaml(str(REPO / "jobs" / "cartpole_ppo.yaml"), ("algo.lr=0.002",))
    assert cfg.algo.lr == 0.002 and cfg.env.id == "CartPole-v1"
    again = hpcrl.Config.from_dict(cfg.to_dict())
    assert again == cfg
    bad = small_config(tmp_path)
    bad["algo"]["lr"] = -1.0
    path = write_config(tmp_path, bad)
    with pytest.raises(hpcrl.ConfigError) as from_file:
        hpcrl.Config.from_yaml(str(path))
    plan = run_hpcrl("plan", str(path), "--world-size", "4")
    assert plan.returncode == 2 and str(from_file.value) in plan.stderr, (str(from_file.value), plan.stderr)
    with pytest.raises(hpcrl.ConfigError, match=r"^<dict>: algo.lr: "):
        hpcrl.Config.from_dict(bad)


def test_import_hpcrl_and_a_config_load_neither_mpi_nor_torch():
    code = ("import sys, hpcrl; hpcrl.Config.from_yaml('jobs/cartpole_ppo.yaml'); "
            "print(sorted({'mpi4py', 'torch', 'horovod'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def sweep(tmp_path, *args: str) -> subprocess.CompletedProcess:
    cfg = small_config(tmp_path, name="sweep", run={"total_frames": 1024})
    cmd = ["bash", str(MPIRUN), "-n", "4", sys.executable, "jobs/sweep_lr.py", str(write_config(tmp_path, cfg)),
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=240,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


def test_a_script_runs_two_configs_in_one_4_rank_job_and_a_policy_plays_from_python(tmp_path):
    done = sweep(tmp_path, "0.001", "0.003")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    runs = tmp_path / "runs"
    for lr in (0.001, 0.003):
        metrics = read_metrics(str(runs / f"sweep_lr{lr:g}" / "metrics.h5"))
        assert metrics["frames"][-1] >= 1024 and np.all(metrics["lr"] == lr), lr
    assert done.stdout.count("roles: learner ranks 0; inference ranks 1; env ranks 2-3") == 2

    policy = hpcrl.load_policy(str(runs / "sweep_lr0.001"), deterministic=True)
    actions = policy.act(np.zeros((1, 4), dtype=np.float32), None)
    assert actions.shape == (1,) and actions[0] in (0, 1)
    result = hpcrl.evaluate(str(runs / "sweep_lr0.001"), episodes=2, seed=1)
    assert len(result.returns) == 2 and result.frames >= 1024 and min(result.returns) >= 1

    refused = sweep(tmp_path, "-0.5")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert refused.stderr.count("hpcrl: config error:") == 1 and "algo.lr" in refused.stderr, refused.stderr
    assert not (runs / "sweep_lr-0.5").exists()
