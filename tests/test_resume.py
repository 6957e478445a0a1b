"""Preemption and resume through real mpirun jobs: exact continuation in serial mode and, with
run.deterministic, on several ranks (after a preemption and after kill -9, on other numbers of env
ranks), and a signalled multi-rank run that resumes with a different number of env ranks."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from hpcrl.core.reproducible import MEASURED_COLUMNS
from hpcrl.io.checkpoint import CheckpointError, load_checkpoint, read_counters_and_provenance
from hpcrl.io.metrics import read_metrics
from tests.conftest import MPIRUN, REPO, job_pids, mpirun, run_dir, run_hpcrl, small_config, write_config

EXIT_PREEMPTED = 3


def whole_and_halves(tmp_path, config, total: int) -> tuple[dict, dict]:
    """One serial run of `total` frames, and one of total / 2 resumed to `total` (its second
    launch must say it resumes): their metrics rows, and their last checkpoints."""
    whole = config(name="whole", run={"total_frames": total})
    assert mpirun(1, "run", str(write_config(tmp_path, whole, "whole.yaml"))).returncode == 0
    halves = config(name="halves", run={"total_frames": total // 2})
    path = str(write_config(tmp_path, halves, "halves.yaml"))
    assert mpirun(1, "run", path).returncode == 0
    second = mpirun(1, "run", path, "--set", f"run.total_frames={total}")
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stdout and "warning" not in second.stdout, second.stdout
    return tuple({"metrics": read_metrics(str(run_dir(c) / "metrics.h5")), "checkpoint":
                  load_checkpoint(str(run_dir(c) / "checkpoint.h5")), "stdout": out}
                 for c, out in ((whole, ""), (halves, second.stdout)))


def assert_same_models(a: dict, b: dict) -> None:
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


@pytest.mark.parametrize("normalize_reward, core", [(False, "none"), (True, "none"), (False, "lstm")])
def test_serial_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, normalize_reward, core):
    """With env.normalize_reward the trainer's reward scale (every env rank's return statistics)
    travels in the checkpoint: without it the resumed losses would differ. With a recurrent core,
    the env rows' hidden states travel in it too (episodes go on across the resume). algo.schedule's
    steps, one on each side of the resume at 640 frames and one on it, take effect at the same
    updates in both runs."""
    algo = {"lr_schedule": "constant", "ent_coef": 0.01,
            "schedule": {"ent_coef": [[320, 0.5], [960, 0.0]], "lr": [[640, 0.5]]}}
    env = {"normalize_reward": normalize_reward}
    model = {"core": core, "core_size": 16}
    a, b = whole_and_halves(tmp_path, lambda name, run: small_config(
        tmp_path, name=name, run=run, algo=algo, env=env, model=model), 1280)
    assert "policy version 10, 640 frames" in b["stdout"]
    for key in ("frames", "policy_version", "episodes", "return_mean", "return_window_mean", "loss_policy",
                "loss_value", "entropy"):
        np.testing.assert_array_equal(a["metrics"][key], b["metrics"][key], err_msg=key)  # bit-identical, row for row
    for m in (a["metrics"], b["metrics"]):  # each row's update began at the row before's frames
        began = np.concatenate([[0], m["frames"][:-1]])
        np.testing.assert_allclose(m["algo.ent_coef"], 0.01 * np.select([began < 320, began < 960], [1.0, 0.5], 0.0))
        np.testing.assert_allclose(m["lr"], 0.001 * np.where(began < 640, 1.0, 0.5))
    ca, cb = a["checkpoint"], b["checkpoint"]
    assert_same_models(ca, cb)
    saved = cb["parts"]["step"]
    assert ("reward_return_moments" in saved) == normalize_reward
    if normalize_reward:  # count: SB3's 1e-4 start plus one return per frame
        assert saved["reward_return_moments"][2] == pytest.approx(1280 + 1e-4)
        np.testing.assert_array_equal(saved["reward_return_moments"], ca["parts"]["step"]["reward_return_moments"])


# DQN with n-step windows across records; SAC whose replay ratio owes several updates per record
# (the actor waits for them) and whose random actions end in the first half; TD3 free-running (a
# checkpoint due mid-record waits for the next record's arrival)
REPLAY_CASES = {
    "dqn": ("dqn", {"dqn": {"n_step": 3, "gradient_steps": 2}, "replay": {"replay_ratio": 4}}),
    "sac": ("sac", {"sac": {"n_step": 2, "gradient_steps": 1, "learning_starts": 200}}),
    "td3": ("td3", {"sac": {"gradient_steps": 1, "learning_starts": 200}, "replay": {"replay_ratio": None}}),
    "dqn-sync": ("dqn", {"dqn": {"n_step": 3}, "replay": {"replay_ratio": 4}}),  # rounds: algo.mode sync
}


@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_serial_replay_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, case):
    """Replay algorithms, async and in sync rounds: the checkpoint holds the envs, the actor's
    n-step windows and exploration generator, the replay shard and the updates its ratio still owes,
    and is taken only where the actor is between records, so the resumed run repeats the
    uninterrupted one."""
    from tests.test_dqn_runs import dqn_config
    from tests.test_sac_runs import sac_config
    family, settings = REPLAY_CASES[case]

    def config(name: str, run: dict) -> dict:
        run = {**run, "name": name, "checkpoint_interval_s": 0.3}  # checkpoints fall due mid-record too
        sections = dict(run=run, roles={"inference": {"ranks": 0}}, model={"hidden_sizes": [16, 16]})
        cfg = dqn_config(tmp_path, **sections) if family == "dqn" else sac_config(tmp_path, family, **sections)
        algo = cfg["algo"]
        for key, value in settings.items():
            algo[key] = {**algo[key], **value}
        algo["lr_schedule"] = "constant"
        algo["mode"] = "sync" if case.endswith("sync") else "async"
        algo["replay"].update(checkpoint=True, beta=1.0)  # beta anneals over run.total_frames, which differ
        return cfg
    a, b = whole_and_halves(tmp_path, config, 1024)
    ma, mb = a["metrics"], b["metrics"]
    assert len(ma["frames"]) == len(mb["frames"]) and mb["frames"][-1] >= 1024
    for key in set(ma) - {"wall_time", "fps", "learner_rss_mib"}:
        np.testing.assert_array_equal(ma[key], mb[key], err_msg=key)  # bit-identical, row for row
    assert_same_models(a["checkpoint"], b["checkpoint"])
    trained = np.isfinite(ma["td_error"])  # sync: the warm-up's rounds take no gradient step (nan)
    assert trained[-1] and (trained.all() or case.endswith("sync")) and ma["replay_size"][-1] > 900


def test_a_sync_run_resumes_exactly_after_a_preemption_and_a_kill_9_on_other_numbers_of_env_ranks(tmp_path):
    """run.deterministic: each env rank writes its envs' states where a checkpoint falls (env-state/
    in the run directory, env by env), before the checkpoint names them. A run of 12 envs on 2 env
    ranks of 6, preempted (SIGTERM to the launcher), resumed on 4 env ranks of 3 (each taking its
    envs from the files that hold them), killed with kill -9 after a later checkpoint, and resumed
    again on 2 env ranks of 6, ends with the weights, optimizer state and metric rows of the run
    that never stopped."""
    from tests.test_stop_signals import read_until, start

    def config(name: str) -> dict:  # 30 versions of 192 frames
        return small_config(tmp_path, name=name, run={"total_frames": 5760, "deterministic": True, "inference_block": 3,
                                                      "target_return": None, "checkpoint_interval_s": 0.2,
                                                      "log_interval_s": 0.2},
                            env={"num_envs": 6},
                            algo={"rollout_length": 16, "epochs": 2, "num_minibatches": 4, "ent_coef": 0.01,
                                  "lr_schedule": "constant"})
    whole, broken = config("whole"), config("broken")
    done = mpirun(4, "run", str(write_config(tmp_path, whole, "whole.yaml")))
    assert done.returncode == 0, done.stdout + done.stderr
    path = str(write_config(tmp_path, broken, "broken.yaml"))
    proc = start(tmp_path, broken, "bash", str(MPIRUN), "-n", "4")
    read_until(proc, "| version")
    os.kill(proc.pid, signal.SIGTERM)  # scripts/mpirun.sh passes it on as SIGUSR1: a preemption
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, out + err
    preempted_at = read_counters_and_provenance(str(run_dir(broken) / "checkpoint.h5"))[0]["policy_version"]
    assert preempted_at < 20
    resumed = start(tmp_path, broken, "bash", str(MPIRUN), "-n", "6", args=("--set", "env.num_envs=3"))
    deadline = time.monotonic() + 120
    while _checkpoint_version(run_dir(broken)) < preempted_at + 3:  # checkpoints of the resumed run
        assert time.monotonic() < deadline and resumed.poll() is None, resumed.communicate()
        time.sleep(0.05)
    for pid in job_pids(path):
        os.kill(pid, signal.SIGKILL)
    resumed.communicate(timeout=60)
    kept = [s for s in os.listdir(run_dir(broken) / "env-state") if s.endswith(".h5")]  # (and perhaps a
    assert {s[:9] for s in kept} == {f"env-0000{r}" for r in range(4)} and len(kept) <= 8  # write cut short)
    last = mpirun(4, "run", path)
    assert last.returncode == 0 and "resuming from" in last.stdout, last.stdout + last.stderr
    # (the kill may cut a checkpoint's write short: its temporary is removed, the one before it used)
    warnings = [line for line in (last.stdout + last.stderr).splitlines()
                if "warning" in line and "a checkpoint a stopped run had not finished writing" not in line]
    assert not warnings, last.stdout + last.stderr
    assert not list((run_dir(broken) / "env-state").glob("*.tmp.*"))  # the killed writers' temporaries are gone
    report = run_hpcrl("inspect", str(run_dir(broken)))
    assert ("env states   kept by all 2 env ranks at policy version 30, env by env: a resume on any number of env "
            "ranks with 12 envs in all continues exactly" in report.stdout), report.stdout + report.stderr
    a, b = (load_checkpoint(str(run_dir(c) / "checkpoint.h5")) for c in (whole, broken))
    assert a["counters"]["policy_version"] == b["counters"]["policy_version"] == 30
    assert_same_models(a, b)
    for key, value in a["optimizer"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b["optimizer"][key]), key
    ma, mb = (read_metrics(str(run_dir(c) / "metrics.h5")) for c in (whole, broken))
    for key in set(ma) - set(MEASURED_COLUMNS):
        np.testing.assert_array_equal(ma[key], mb[key], err_msg=key)  # bit-identical, row for row


def _checkpoint_version(path) -> int:
    try:
        return read_counters_and_provenance(str(path / "checkpoint.h5"))[0]["policy_version"]
    except (CheckpointError, OSError):
        return -1  # none yet, or being replaced


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
    assert '"state": "preempted"' in (run_dir(cfg) / "status.json").read_text()  # io/run_status.py
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


def test_a_resume_that_changes_hyperparameters_says_so_and_keeps_the_config_before(tmp_path):
    """Issue 46, item 4: `--set algo.lr=0.1` on a resume was taken silently and config.yaml lost
    the old value. The resume says what changed in one line; config_history.yaml keeps each config
    a resume replaced, oldest first, headed by what it ran to."""
    import yaml
    cfg = small_config(tmp_path, run={"total_frames": 256}, roles={"inference": {"ranks": 0}})
    path = str(write_config(tmp_path, cfg))
    assert mpirun(1, "run", path).returncode == 0
    resumed = mpirun(1, "run", path, "--set", "algo.lr=0.1", "--set", "run.total_frames=512")
    assert resumed.returncode == 0, resumed.stderr
    lines = [line for line in resumed.stdout.splitlines() if "resuming with" in line]
    assert lines == ["[hpcrl] resuming with run.total_frames 512 (was 256); algo.lr 0.1 (was 0.001); the config "
                     "before is kept in config_history.yaml"], resumed.stdout
    again = mpirun(1, "run", path, "--set", "algo.lr=0.1", "--set", "run.total_frames=768")
    assert again.returncode == 0 and "algo.lr" not in again.stdout, again.stdout  # said once, when it changed
    history = (run_dir(cfg) / "config_history.yaml").read_text()
    assert history.startswith("--- # the config up to policy version 4, 256 frames; resumed at ")
    assert "with run.total_frames 512 (was 256); algo.lr 0.1 (was 0.001)\n" in history
    configs = list(yaml.safe_load_all(history))
    assert [(c["algo"]["lr"], c["run"]["total_frames"]) for c in configs] == [(0.001, 256), (0.1, 512)]
    assert yaml.safe_load((run_dir(cfg) / "config.yaml").read_text())["run"]["total_frames"] == 768
