"""`hpcrl plot`: learning curves of run directories against frames and against wall time.

Runs that differ only in their seed (and name) form one group, drawn as the mean across the runs
with a band of one standard deviation, on a common grid of x values; a group of one run is its
own curve. No MPI and no torch.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from hpcrl.io.rundir import METRICS_FILE
from hpcrl.core.say import say
from hpcrl.tools.inspect import RunDirError, load_config_dict, load_metrics, open_run_dir

GROUP_BY = ("config", "name", "none")
# Keys that name a run or say how it is run, not what it learns: runs differing only here are seeds.
NOT_LEARNING = ("name", "output_dir", "seed", "log_interval_s", "checkpoint_interval_s", "hang_timeout_s",
                "peer_timeout_s", "torch_threads", "replica_digests", "tensorboard", "wandb")
SEED_SUFFIX = re.compile(r"[-_.]?(seed|s)?\d+$")
GRID_POINTS = 200
DEFAULT_METRICS = ("rating", "return_window_mean", "return_mean")  # the first a run has


class PlotError(ValueError):
    """An output the plot cannot be written to."""


@dataclass
class Curve:
    """One run's series, rows without a value (no finished episode yet) dropped."""

    run_dir: str
    metric: str
    frames: np.ndarray
    wall_time: np.ndarray
    values: np.ndarray


def load_curve(run_dir: str, metric: str | None = None, metrics: dict | None = None) -> Curve:
    """`metric` of one run against frames and wall time; by default its rating against anchors
    (self-play with algo.selfplay.anchors, whose zero-sum returns say nothing), else
    return_window_mean, else return_mean. `metrics`: the run's metrics.h5, read already."""
    m = load_metrics(run_dir) if metrics is None else metrics
    name = metric or next((k for k in DEFAULT_METRICS if k in m), None)
    if name not in m or m[name].ndim != 1:
        valid = ", ".join(k for k, v in m.items() if v.ndim == 1)
        wanted = f"series {name!r}" if name else "return_window_mean nor return_mean"
        raise RunDirError(f"{run_dir!r}: metrics.h5 has no {wanted} (it has: {valid}); pick one with --metric")
    values = m[name].astype(np.float64)
    keep = np.isfinite(values)
    if not keep.any():
        raise RunDirError(f"{run_dir!r}: {name} has no value yet (no episode has finished)")
    return Curve(run_dir, name, m["frames"][keep].astype(np.float64), m["wall_time"][keep].astype(np.float64),
                 values[keep])


def expand_run_dirs(paths: list[str]) -> list[str]:
    """Run directories as given; a directory of run directories (run.output_dir) stands for all of them."""
    out = []
    for path in paths:
        try:
            out.append(open_run_dir(path))
        except RunDirError:
            inner = sorted(os.path.join(path, d) for d in os.listdir(path)) if os.path.isdir(path) else []
            runs = [d for d in inner if os.path.isdir(d) and os.path.exists(os.path.join(d, METRICS_FILE))]
            if not runs:
                raise
            out += runs
    return out


def readable_runs(run_dirs: list[str], metric: str | None, group_by: str) -> tuple[list[str], dict[str, Curve]]:
    """The runs whose files can be read, and their curves (one series for every run: `metric`, or
    the first readable run's default). Among several runs one whose metrics.h5 (or, to group by
    config, config.yaml) cannot be read, a run that crashed before its first rows or a damaged
    file, is left out with a warning; a lone run that cannot be read, or none of several, is a
    RunDirError, and so is a readable run without the series (pick one with --metric)."""
    if len(run_dirs) == 1:
        return run_dirs, {run_dirs[0]: load_curve(run_dirs[0], metric)}
    read: dict[str, dict] = {}
    problems = []
    for run_dir in run_dirs:
        try:
            read[run_dir] = load_metrics(run_dir)
            if group_by == "config":
                load_config_dict(run_dir)
        except RunDirError as exc:
            read.pop(run_dir, None)
            problems.append(str(exc))
            say(f"warning: plot: left out {run_dir}: {exc}")
    if not read:
        raise RunDirError(f"none of the {len(run_dirs)} runs can be plotted: {'; '.join(problems)}")
    first = next(iter(read))
    name = load_curve(first, metric, read[first]).metric
    return list(read), {d: load_curve(d, name, m) for d, m in read.items()}


def group_runs(run_dirs: list[str], group_by: str = "config") -> list[tuple[str, list[str]]]:
    """[(label, run dirs)] in the order the runs were given. 'config': runs whose resolved configs
    are equal but for the run's name, seed and logging keys; 'name': runs whose directory names are
    equal once a trailing seed suffix (_s1, -seed2, _3) is removed; 'none': every run alone."""
    # (key, run dirs), keys compared with ==: json.dumps of a config fails on YAML dates and mixed key types
    groups: list[tuple[object, list[str]]] = []
    for run_dir in run_dirs:
        base = os.path.basename(os.path.normpath(run_dir))
        if group_by == "none":
            key = run_dir
        elif group_by == "name":
            key = SEED_SUFFIX.sub("", base) or base
        else:
            cfg = load_config_dict(run_dir)
            run = cfg.get("run")
            if isinstance(run, dict):
                run = {k: v for k, v in run.items() if k not in NOT_LEARNING}
            key = {**cfg, "run": run}
        same = next((dirs for other, dirs in groups if other == key), None)
        if same is None:
            groups.append((key, [run_dir]))
        else:
            same.append(run_dir)
    return [(_label(dirs, group_by), dirs) for _, dirs in groups]


def _label(run_dirs: list[str], group_by: str) -> str:
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    if len(names) == 1:
        return names[0]
    stem = SEED_SUFFIX.sub("", names[0]) if group_by == "name" else os.path.commonprefix(names).rstrip("-_.")
    stem = re.sub(r"[-_.](seed|s)$", "", stem) or names[0]
    return f"{stem} ({len(names)} runs)"


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start."""
    if weight <= 0:
        return values
    out, last = np.empty_like(values), 0.0
    for i, v in enumerate(values):
        last = last * weight + (1 - weight) * v
        out[i] = last / (1 - weight ** (i + 1))
    return out


def band(xs: list[np.ndarray], ys: list[np.ndarray], points: int = GRID_POINTS):
    """Mean and standard deviation across runs on a common grid: the x range every run covers,
    each run linearly interpolated onto it. Returns (grid, mean, std)."""
    lo, hi = max(x[0] for x in xs), min(x[-1] for x in xs)
    if hi < lo:
        raise RunDirError("the runs of a group share no range of x values to average over "
                          "(plot them with --group-by none)")
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    on_grid = np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])
    return grid, on_grid.mean(axis=0), on_grid.std(axis=0)


def check_output(output: str) -> None:
    """A PlotError unless `output` names an image format matplotlib writes, in a directory that
    exists (checked before anything is read or drawn)."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on a cluster's login or compute nodes
    from matplotlib.backend_bases import FigureCanvasBase
    formats = FigureCanvasBase.get_supported_filetypes()
    if os.path.splitext(output)[1][1:].lower() not in formats:
        raise PlotError(f"-o {output}: the extension names no image format; use one of "
                        f"{', '.join('.' + f for f in sorted(formats))}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise PlotError(f"-o {output}: directory {os.path.dirname(output)!r} does not exist")


def plot_runs(run_dirs: list[str], output: str, metric: str | None = None, smoothing: float = 0.0,
              group_by: str = "config") -> list[tuple[str, list[str]]]:
    """Draw the two panels into `output` (the format from its extension); returns the groups drawn."""
    check_output(output)
    import matplotlib.pyplot as plt
    run_dirs, curves = readable_runs(expand_run_dirs(run_dirs), metric, group_by)
    groups = group_runs(run_dirs, group_by)
    name = curves[run_dirs[0]].metric
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (label, dirs) in enumerate(groups):
        color = f"C{i % 10}"
        for ax, x_key in zip(axes, ("frames", "wall_time")):
            xs = [getattr(curves[d], x_key) for d in dirs]
            ys = [smooth(curves[d].values, smoothing) for d in dirs]
            if len(dirs) == 1:
                ax.plot(xs[0], ys[0], color=color, label=label)
            else:
                grid, mean, std = band(xs, ys)
                ax.plot(grid, mean, color=color, label=label)
                ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.25, linewidth=0)
    for ax, xlabel in zip(axes, ("frames", "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize="small")
    band_note = "; mean ± 1 std across runs" if any(len(d) > 1 for _, d in groups) else ""
    fig.suptitle(f"{name}{f' (smoothing {smoothing})' if smoothing else ''}{band_note}")
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return groups
