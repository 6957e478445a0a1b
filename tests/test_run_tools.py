"""`hpcrl inspect` and `hpcrl eval` on a real run: the shipped CartPole job trained serially (world
size 1, about 20 s), then read back, played, filmed and plotted."""
import json
import shutil
import subprocess
import sys

import h5py
import imageio.v2 as imageio
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpcrl.io.metrics import read_metrics
from tests.conftest import REPO, mpirun


def hpcrl(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def solved_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    result = mpirun(1, "run", str(REPO / "jobs" / "cartpole_ppo.yaml"), "--set", f"run.output_dir={out}",
                    "--set", f"run.eval={{every_frames: {EVERY}, episodes: 2}}")
    assert result.returncode == 0, result.stdout + result.stderr
    (out / "cartpole_ppo" / "test.stdout").write_text(result.stdout)
    return out / "cartpole_ppo"


EVERY = 5_000  # run.eval.every_frames of the solved run (it ends near 14,000 frames)


def test_the_run_evaluated_each_time_it_passed_a_multiple_of_every_frames(solved_run):
    """run.eval (workers/evaluator.py): eval_* series of their own, NaN but in the rows of
    updates that passed a multiple of run.eval.every_frames; a line for each; inspect names the
    last; TensorBoard has them as eval/."""
    m = read_metrics(str(solved_run / "metrics.h5"))
    done = np.isfinite(m["eval_return_mean"])
    passed = m["frames"] // EVERY
    assert done.tolist() == (np.diff(passed, prepend=0) > 0).tolist() and done.sum() >= 2
    assert (m["eval_length_mean"][done] >= 8).all() and np.isfinite(m["eval_return_std"][done]).all()
    lines = [line for line in (solved_run / "test.stdout").read_text().splitlines() if "] eval at " in line]
    assert len(lines) == done.sum()
    last = int(np.flatnonzero(done)[-1])
    assert (f"eval at {m['frames'][last]:,} frames (version {m['policy_version'][last]}): return "
            f"{m['eval_return_mean'][last]:.1f} +- {m['eval_return_std'][last]:.1f} over 2 episodes "
            f"(deterministic)") in lines[-1]
    report = hpcrl("inspect", str(solved_run)).stdout
    assert (f"last eval {m['eval_return_mean'][last]:.1f} +- {m['eval_return_std'][last]:.1f} at "
            f"{m['frames'][last]:,} frames ({done.sum()} evaluations, run.eval)") in report
    events = EventAccumulator(str(solved_run))
    events.Reload()
    scalars = events.Scalars("eval/return_mean")  # NaN rows are no points
    assert [s.step for s in scalars] == m["frames"][done].tolist()
    assert [s.value for s in scalars] == pytest.approx(m["eval_return_mean"][done].tolist())


def test_inspect_prints_config_progress_and_checkpoint(solved_run):
    result = hpcrl("inspect", str(solved_run))
    assert result.returncode == 0, result.stderr
    m = read_metrics(str(solved_run / "metrics.h5"))
    frames, version = int(m["frames"][-1]), int(m["policy_version"][-1])
    out = result.stdout
    assert "config       CartPole-v1 x 8 per env rank; ppo sync, rollout 32" in out
    assert "roles: learner 1, inference 1, env rest; seed 1; total_frames 300,000; target_return 475.0" in out
    assert "status       finished: it reached run.target_return" in out
    assert f"progress     {frames:,} frames ({100 * frames / 300_000:.1f}% of run.total_frames), {len(m['frames'])} " \
           f"updates, policy version {version}" in out
    assert f"last return {m['return_window_mean'][-1]:.1f} (mean of the last >= 20 episodes)" in out
    assert f"checkpoint   checkpoint.h5, {(solved_run / 'checkpoint.h5').stat().st_size / 1024:,.1f} KiB" in out
    assert f"policy version {version}, {frames:,} frames, {version} updates, digest OK" in out
    assert "previous     none" in out

    info = json.loads(hpcrl("inspect", str(solved_run), "--json").stdout)
    assert info["finished"] and info["stopped_by"] == "target_return"
    assert info["ended"]["state"] == "done"  # status.json (io/run_status.py)
    assert info["progress"]["frames"] == frames and info["config"]["env"]["id"] == "CartPole-v1"
    full = hpcrl("inspect", str(solved_run), "--config").stdout
    assert "  algo:\n    name: ppo\n" in full and "    gae_lambda: 0.8\n" in full


def test_inspect_names_a_corrupt_checkpoint_and_the_one_a_resume_would_use(solved_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(solved_run, copy)
    shutil.copy(copy / "checkpoint.h5", copy / "checkpoint.prev.h5")
    with h5py.File(copy / "checkpoint.h5", "r") as f:  # where the model's largest tensor lies in the file
        datasets = []
        f["model"].visititems(lambda name, item: datasets.append(item) if isinstance(item, h5py.Dataset) else None)
        largest = max(datasets, key=lambda d: d.nbytes)
        offset = largest.id.get_offset()
    with open(copy / "checkpoint.h5", "r+b") as fh:  # flip bytes of that data, not of the file's metadata
        fh.seek(offset)
        fh.write(b"\xff" * 64)
    out = hpcrl("inspect", str(copy)).stdout
    assert "checkpoint   checkpoint.h5" in out and "NOT USABLE:" in out
    assert "previous     checkpoint.prev.h5" in out and "digest OK" in out
    assert "resume from  checkpoint.prev.h5 (the latest one is not usable)" in out


def test_deterministic_eval_of_the_solved_run_reaches_475_without_mpi(solved_run):
    code = ("import sys; from hpcrl.tools.cli import main; rc = main(sys.argv[1:]); "
            "assert 'mpi4py' not in sys.modules and 'horovod' not in sys.modules; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, "eval", str(solved_run), "--episodes", "10",
                             "--deterministic", "--json"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["episodes"] == 10 and len(summary["returns"]) == 10
    assert summary["return_mean"] >= 475, summary
    assert summary["return_mean"] == pytest.approx(np.mean(summary["returns"]))
    assert summary["return_std"] == pytest.approx(np.std(summary["returns"]))
    assert summary["policy_version"] == int(read_metrics(str(solved_run / "metrics.h5"))["policy_version"][-1])


def test_eval_prints_the_mean_and_writes_a_readable_video(solved_run, tmp_path):
    video = tmp_path / "cartpole.mp4"
    result = hpcrl("eval", str(solved_run), "--episodes", "2", "--seed", "5", "--video", str(video))
    assert result.returncode == 0, result.stderr
    returns = json.loads(hpcrl("eval", str(solved_run), "--episodes", "2", "--seed", "5", "--json").stdout)["returns"]
    # the same seed plays the same episodes, with or without the camera
    assert f"return {np.mean(returns):.2f} +- {np.std(returns):.2f}" in result.stdout
    steps = int(sum(returns))  # CartPole pays 1 per step
    assert f"wrote {video}: {steps + 1} frames" in result.stdout  # the first observation, then every step
    count, first, last = 0, None, None
    for frame in imageio.get_reader(str(video)):  # streamed: 1,000 full frames would be 700 MB
        count, first, last = count + 1, frame if first is None else first, frame
    assert count == steps + 1
    assert first.shape == (400, 600, 3) and first.std() > 10 and last.std() > 10  # pictures, not blanks


@pytest.mark.parametrize("setup,args,message", [
    (None, ["--episodes", "3"], "does not exist"),
    ("config-only", ["--episodes", "3"], "holds no usable checkpoint"),
    ("config-only", ["--episodes", "0"], "--episodes: expected at least 1, got 0"),
])
def test_eval_refuses_with_one_message(tmp_path, setup, args, message):
    run_dir = tmp_path / "run"
    if setup:
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text("run: {}\n")
    result = hpcrl("eval", str(run_dir), *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr


def test_inspect_refuses_a_directory_that_is_not_a_run(tmp_path):
    result = hpcrl("inspect", str(tmp_path))
    assert result.returncode == 2 and "is not a run directory" in result.stderr and "Traceback" not in result.stderr


def test_plot_of_the_real_run(solved_run, tmp_path):
    result = hpcrl("plot", str(solved_run), "-o", str(tmp_path / "c.png"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "c.png").stat().st_size > 10_000
