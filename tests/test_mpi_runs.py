"""Real multi-rank jobs through mpirun: training, on-policy versions, failure handling. (Runs that
repeat, serially or on several ranks, and learners that stay bit-identical: tests/test_reproducible.py
and tests/test_resume.py, whose exact resumes compare against an uninterrupted run.)"""

import re

import numpy as np
import pytest

from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.core.startup import FIRST_WORK, MARKS
from hpcrl.io.metrics import read_crossed_nodes, read_metrics, read_startup
from tests.conftest import mpirun, run_dir, small_config, write_config


def check_finished(result, cfg, min_frames, sync=True):
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    out = run_dir(cfg)
    metrics = read_metrics(str(out / "metrics.h5"))
    assert metrics["frames"][-1] >= min_frames
    assert np.all(np.diff(metrics["policy_version"]) == 1) and metrics["policy_version"][0] == 1
    if sync:  # every sample of update k was collected with policy version k-1 (the one trained)
        assert np.all(metrics["sample_version_min"] == metrics["policy_version"] - 1)
        assert np.all(metrics["sample_version_max"] == metrics["policy_version"] - 1)
        assert np.all(metrics["policy_lag_max"] == 0)
    ck = load_checkpoint(str(out / "checkpoint.h5"))
    assert ck["counters"]["frames"] == metrics["frames"][-1]
    assert ck["counters"]["policy_version"] == metrics["policy_version"][-1]
    assert (out / "config.yaml").read_text() == ck["config"]
    assert "[hpcrl] frames" in result.stdout
    return metrics


@pytest.mark.parametrize("ranks,roles", [
    (1, {}),  # serial: every role in one process
    (2, {"inference": {"ranks": 0}}),  # learner + one env rank with inline inference
    (4, {}),  # 1 learner, 1 inference, 2 env
])
def test_short_training_run(tmp_path, ranks, roles):
    cfg = small_config(tmp_path, roles=roles)
    # Python reports every module each rank imports (on stderr): a lone learner averages nothing,
    # so no rank may import Horovod (the two-learner test below sees it imported); nothing compiles,
    # so none imports torch._dynamo either (1 s of start-up: torch.optim imports it, models/adam.py)
    result = mpirun(ranks, "run", str(write_config(tmp_path, cfg)), "--verbose",
                    extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert not imported("horovod", result.stderr) and imported("torch", result.stderr)
    assert not imported("torch._dynamo", result.stderr)
    metrics = check_finished(result, cfg, 2048)
    env_ranks = max(ranks - 2, 1) if ranks != 2 else 1
    assert metrics["frames"][0] == env_ranks * 16 * 4  # one fragment per env rank per update
    crossed = read_crossed_nodes(str(run_dir(cfg) / "metrics.h5"))  # one node: nothing crosses
    assert set(crossed.values()) == {(0, 0)}, crossed
    assert "crossed nodes" not in result.stdout
    check_startup(result, run_dir(cfg) / "metrics.h5", ranks, env_ranks)


def imported(module: str, import_times: str) -> bool:
    """Whether Python's import-time report (PYTHONPROFILEIMPORTTIME, on stderr) names `module`."""
    return re.search(rf"^import time: .*\|\s+{re.escape(module)}$", import_times, re.MULTILINE) is not None


def check_startup(result, metrics_path, ranks: int, env_ranks: int) -> None:
    """Every rank's start-up marks reach metrics.h5, in order, each up to its roles' first work;
    --verbose printed each rank's phases once."""
    startup = read_startup(str(metrics_path))
    assert list(startup) == list(MARKS)
    table = np.stack([startup[m] for m in MARKS], axis=1)
    assert table.shape == (ranks, len(MARKS))
    common = MARKS[:MARKS.index("roles") + 1]  # every rank passes these
    for rank, row in enumerate(table):
        passed = row[~np.isnan(row)]
        assert np.all(np.diff(passed) >= 0) and passed[0] > 0, (rank, row)
        assert not np.isnan(row[:len(common)]).any(), (rank, row)
    # the ranks that did each role's first piece of work (inline inference answers no batch of requests)
    works = {role: int((~np.isnan(startup[mark])).sum()) for role, mark in FIRST_WORK.items()}
    assert works == {"learner": 1, "inference": 1 if ranks == 4 else 0, "env": env_ranks}, works
    assert result.stdout.count("[hpcrl] start-up of rank") == ranks, result.stdout


@pytest.mark.parametrize("backend", ["numpy", "envpool"])
def test_serial_runs_on_vectorised_backends(tmp_path, backend):
    cfg = small_config(tmp_path, env={"backend": backend, "normalize_reward": True},
                       roles={"inference": {"ranks": 0}}, run={"total_frames": 1024})
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    metrics = check_finished(result, cfg, 1024)
    assert metrics["return_mean"][-1] >= 8  # raw CartPole returns (1 a step), not normalised ones
    # serial checkpoints hold the env vector's state as data; an envpool pool's state lives in C++
    # where hpcrl cannot read it: a warning, no failure
    assert ("cannot be saved as data" in result.stdout + result.stderr) == (backend == "envpool")


DQN_SMALL = {"name": "dqn", "rollout_length": 8, "dqn": {"batch_size": 32, "gradient_steps": 2},
             "replay": {"capacity": 10_000, "warmup": 128}}


@pytest.mark.parametrize("algo, core", [
    ({}, "none"),  # PPO: fragments, sampled actions from the policy server
    ({}, "lstm"),  # and with a recurrent policy: the hidden states travel as plain numbers
    # DQN: epsilon-greedy on Q-values, n-step transitions and priorities, all in numpy on the actor
    (DQN_SMALL, "none"),
    # R2D2: sequences, their start states and initial priorities, all in numpy on the actor
    ({**DQN_SMALL, "dqn": {"batch_size": 8, "gradient_steps": 2, "sequence_length": 8, "burn_in": 2,
                           "sequence_period": 4}, "replay": {"capacity": 1_000, "warmup": 16}}, "gru"),
], ids=["ppo", "ppo-lstm", "dqn", "r2d2"])
def test_env_ranks_with_remote_inference_never_import_torch(tmp_path, algo, core):
    report = tmp_path / "modules"
    report.mkdir()
    cfg = small_config(tmp_path, env={"id": "tests.instrumented_envs:HpcrlTest/ModuleReporting-v0",
                                      "kwargs": {"report_dir": str(report)}}, run={"total_frames": 256},
                       model={"core": core, "core_size": 8})
    if algo:
        cfg["algo"] = algo
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stderr
    by_rank = {}
    for path in report.glob("rank*"):
        by_rank.setdefault(path.name.split("-")[0], []).append(path.read_text())
    assert by_rank["rank2"] == [""] and by_rank["rank3"] == [""]  # env ranks: neither torch nor horovod
    assert "rank1" not in by_rank  # the inference rank steps no env
    for rank in (2, 3):  # the collector, paused for start-up, runs again, with start-up's objects frozen
        (path,) = report.glob(f"gc-rank{rank}-*")  # (rank 0 made an env during start-up's checks: paused then)
        enabled, frozen = path.read_text().split()
        assert enabled == "True" and int(frozen) > 10_000, (path.name, enabled, frozen)


@pytest.mark.parametrize("ranks", [1, 4])
def test_config_error_exits_2_with_one_message(tmp_path, ranks):
    """Every rank exits 2 after rank 0's one line; scripts/mpirun.sh leaves out the notices Open
    MPI adds after a non-zero exit (docs/running.md, exit statuses): stderr is that line alone."""
    cfg = small_config(tmp_path, algo={"gama": 0.9})
    result = mpirun(ranks, "run", str(write_config(tmp_path, cfg)), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("did you mean 'gamma'") == 1
    assert result.stderr.startswith("hpcrl: config error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_layout_that_does_not_fit_says_which_size_would(tmp_path):
    cfg = small_config(tmp_path, roles={"learner": {"ranks": 1}, "inference": {"ranks": 1}, "env": {"ranks": 2}})
    result = mpirun(3, "run", str(write_config(tmp_path, cfg)), timeout=120)
    assert result.returncode == 2
    assert "run with mpirun -n 4" in result.stderr and "Traceback" not in result.stderr


def test_unknown_env_is_a_config_error(tmp_path):
    cfg = small_config(tmp_path, env={"id": "CartPole-v99"})
    result = mpirun(3, "run", str(write_config(tmp_path, cfg)), timeout=120)
    assert result.returncode == 2 and "env.id: cannot make environment 'CartPole-v99'" in result.stderr


def test_cuda_device_without_a_gpu_is_a_config_error(tmp_path):
    cfg = small_config(tmp_path, roles={"inference": {"ranks": 1, "device": "cuda"}})
    # hide any GPU so the test means the same on a GPU machine (mpirun passes the variable on)
    result = mpirun(3, "run", str(write_config(tmp_path, cfg)), timeout=120, extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "roles.inference.device is 'cuda' but no node of this job has a GPU it may use" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_finished_run_is_not_trained_again_nor_overwritten_without_asking(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 256})
    path = str(write_config(tmp_path, cfg))
    assert mpirun(1, "run", path).returncode == 0
    before = (run_dir(cfg) / "metrics.h5").read_bytes()
    again = mpirun(1, "run", path)
    assert again.returncode == 0 and "nothing to do" in again.stdout and "raise run.total_frames" in again.stdout
    assert (run_dir(cfg) / "metrics.h5").read_bytes() == before
    fresh = mpirun(1, "run", path, "--overwrite")
    assert fresh.returncode == 0 and "resuming" not in fresh.stdout


def test_a_run_without_a_usable_checkpoint_is_not_overwritten(tmp_path):
    cfg = small_config(tmp_path, run={"total_frames": 256})
    path = str(write_config(tmp_path, cfg))
    assert mpirun(1, "run", path).returncode == 0
    (run_dir(cfg) / "checkpoint.h5").write_bytes(b"not hdf5")
    again = mpirun(1, "run", path, "--set", "run.total_frames=512")
    assert again.returncode == 2 and "no usable checkpoint" in again.stderr and "--overwrite" in again.stderr


@pytest.mark.parametrize("change,said", [
    ("model.hidden_sizes=[16]", "model.hidden_sizes = [32, 32], the config now says [16]"),
    ("model.obs_norm=true", "model.obs_norm = False, the config now says True"),  # stats the weights expect
])
def test_resume_refuses_a_different_model(tmp_path, change, said):
    cfg = small_config(tmp_path, run={"total_frames": 256})
    path = str(write_config(tmp_path, cfg))
    assert mpirun(1, "run", path).returncode == 0
    again = mpirun(1, "run", path, "--set", "run.total_frames=512", "--set", change)
    assert again.returncode == 2
    assert f"its checkpoint was trained with {said}" in again.stderr
