"""`hpcrl plot`: grouping of runs, the mean and band across seeds, and the image, on synthetic run
directories (a config.yaml and a metrics.h5 each, written as a run writes them)."""
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from hpcrl.core.config import parse_config, to_yaml
from hpcrl.io.metrics import MetricsWriter
from hpcrl.tools.plot import band, group_runs, load_curve, smooth
from hpcrl.tools.inspect import RunDirError
from tests.conftest import REPO


def fake_run(root, name, seed=1, lr=0.001, slope=1.0, frames=np.arange(100, 1001, 100), first_nan=False):
    run_dir = root / name
    run_dir.mkdir(parents=True)
    cfg = parse_config(f"run: {{name: {name}, seed: {seed}}}\nalgo: {{lr: {lr}}}")
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    writer = MetricsWriter(str(run_dir / "metrics.h5"))
    for i, f in enumerate(frames):
        value = np.nan if first_nan and i == 0 else slope * f
        writer.append({"frames": int(f), "wall_time": f / 100.0, "policy_version": i + 1,
                       "return_window_mean": value, "return_mean": value})
    writer.close()
    return str(run_dir)


def test_runs_differing_only_in_seed_and_name_are_one_group(tmp_path):
    seeds = [fake_run(tmp_path, f"cartpole_s{s}", seed=s) for s in (1, 2, 3)]
    other = fake_run(tmp_path, "cartpole_lr3", seed=1, lr=0.0003)
    groups = group_runs([*seeds, other])
    assert groups == [("cartpole (3 runs)", seeds), ("cartpole_lr3", [other])]
    assert group_runs([*seeds, other], "none") == [(f"cartpole_s{s}", [d]) for s, d in zip((1, 2, 3), seeds)] + [
        ("cartpole_lr3", [other])]
    assert group_runs([*seeds, other], "name") == groups  # the names carry the same grouping here


def test_band_is_the_mean_and_std_across_runs_on_their_common_frame_range(tmp_path):
    slopes = (1.0, 2.0, 6.0)
    frames = (np.arange(100, 1001, 100), np.arange(50, 951, 150), np.arange(120, 1101, 70))
    curves = [load_curve(fake_run(tmp_path, f"r{i}", seed=i, slope=a, frames=f))
              for i, (a, f) in enumerate(zip(slopes, frames))]
    grid, mean, std = band([c.frames for c in curves], [c.values for c in curves])
    assert grid[0] == 120 and grid[-1] == 950  # every run covers [120, 950]; nothing is extrapolated
    # linear curves interpolate exactly: the band is the slopes' mean and std times the frames
    np.testing.assert_allclose(mean, np.mean(slopes) * grid)
    np.testing.assert_allclose(std, np.std(slopes) * grid)


def test_rows_without_a_return_are_left_out_and_smoothing_is_tensorboards(tmp_path):
    curve = load_curve(fake_run(tmp_path, "r", first_nan=True))
    assert curve.frames[0] == 200 and np.isfinite(curve.values).all()
    np.testing.assert_array_equal(smooth(np.array([4.0, 4.0, 4.0]), 0.9), [4.0, 4.0, 4.0])  # debiased
    np.testing.assert_allclose(smooth(np.array([0.0, 10.0]), 0.5), [0.0, 5.0 / 0.75])


def hpcrl(*args):
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=REPO)


def test_plot_writes_an_image_of_the_curves(tmp_path):
    for s, slope in ((1, 1.0), (2, 1.5)):
        fake_run(tmp_path / "runs", f"cp_s{s}", seed=s, slope=slope)
    fake_run(tmp_path / "runs", "cp_lr3", lr=0.0003, slope=0.3)
    out = tmp_path / "curves.png"
    result = hpcrl("plot", str(tmp_path / "runs"), "-o", str(out), "--smooth", "0.5")
    assert result.returncode == 0, result.stderr
    assert "3 runs in 2 curves (cp_lr3, cp (2 runs))" in result.stdout
    image = matplotlib.image.imread(str(out))
    assert image.shape[:2] == (450, 1200)
    pixels = image[..., :3].reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 50  # lines, a band, text: not a blank canvas
    # the default colours of the two curves (C0 blue, C1 orange) are drawn
    assert (np.abs(pixels - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=1) < 0.02).sum() > 100
    assert (np.abs(pixels - np.array([0xFF, 0x7F, 0x0E]) / 255).max(axis=1) < 0.02).sum() > 100


@pytest.mark.parametrize("args,message", [
    (["missing"], "run directory '{tmp}/missing' does not exist"),
    (["empty"], "'{tmp}/empty' is not a run directory"),
    (["started"], "'{tmp}/started' holds no metrics.h5 yet"),
    (["r", "--metric", "nope"], "metrics.h5 has no series 'nope' (it has: frames, policy_version"),
    (["r", "--smooth", "1"], "--smooth: expected a weight in [0, 1), got 1.0"),
    (["r", "-o", "{tmp}/curves.txt"], "the extension names no image format"),
])
def test_plot_refuses_what_it_cannot_draw_with_one_message(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "config.yaml").write_text("run: {}\n")
    fake_run(tmp_path, "r")
    out = ["-o", str(tmp_path / "curves.png")] if "-o" not in args else []
    result = hpcrl("plot", str(tmp_path / args[0]), *(a.format(tmp=tmp_path) for a in args[1:]), *out)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message.format(tmp=tmp_path) in result.stderr


def test_a_run_without_finished_episodes_cannot_be_plotted(tmp_path):
    run_dir = fake_run(tmp_path, "r", frames=np.array([100]), first_nan=True)
    with pytest.raises(RunDirError, match="has no value yet"):
        load_curve(run_dir)


def test_plot_over_many_runs_leaves_out_one_it_cannot_read_with_a_warning(tmp_path):
    """Issue 46, item 6: a run whose env crashed at once left a 48-byte metrics.h5, and
    `hpcrl plot runs` exited 2 for every run because of it."""
    for s in (1, 2):
        fake_run(tmp_path / "runs", f"cp_s{s}", seed=s)
    crashed = tmp_path / "runs" / "crashed"
    crashed.mkdir()
    (crashed / "config.yaml").write_text((tmp_path / "runs" / "cp_s1" / "config.yaml").read_text())
    (crashed / "metrics.h5").write_bytes((tmp_path / "runs" / "cp_s1" / "metrics.h5").read_bytes()[:48])
    out = tmp_path / "curves.png"
    result = hpcrl("plot", str(tmp_path / "runs"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"[hpcrl] warning: plot: left out {crashed}: ")
    assert "2 runs in 1 curve (cp (2 runs))" in result.stdout and out.stat().st_size > 0
    alone = hpcrl("plot", str(crashed), "-o", str(out))  # named alone, it is still an error
    assert alone.returncode == 2 and alone.stderr.startswith("hpcrl: plot: ") and "Traceback" not in alone.stderr
    (tmp_path / "runs" / "cp_s1" / "metrics.h5").write_bytes(b"")
    (tmp_path / "runs" / "cp_s2" / "metrics.h5").write_bytes(b"")
    none = hpcrl("plot", str(tmp_path / "runs"), "-o", str(out))
    assert none.returncode == 2 and "none of the 3 runs can be plotted" in none.stderr
