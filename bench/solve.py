"""Time to solve CartPole-v1 (mean return of the last >= 20 episodes >= 475) from launch.

Runs the shipped jobs through the real launcher for several seeds and prints JSON: per layout the
median wall seconds from `mpirun` start to exit, frames at the stop, and the speed-up against the
serial layout (world size 1) measured in the same run, since these machines are shared and noisy.

    .venv/bin/python bench/solve.py [--seeds 1 2 3] [--out bench/results/solve.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402
from hpcrl.metrics import read_metrics  # noqa: E402

LAYOUTS = [  # (name, ranks, job): serial first, it is the baseline
    ("serial", 1, "cartpole_ppo.yaml"),
    ("4 ranks: 1 learner, 1 inference, 2 env", 4, "cartpole_ppo.yaml"),
    ("6 ranks: 2 learners, 2 inference, 2 env", 6, "cartpole_ppo_2learners.yaml"),
]


def one_run(ranks: int, job: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", str(ranks), sys.executable, "-m", "hpcrl", "run",
               str(REPO / "jobs" / job), "--set", f"run.output_dir={out}", "--set", f"run.seed={seed}"]
        start = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            raise RuntimeError(f"{job} on {ranks} ranks failed:\n{result.stderr[-2000:]}")
        metrics = read_metrics(str(next(Path(out).iterdir()) / "metrics.h5"))
    return {"seed": seed, "seconds_from_launch": round(seconds, 2), "frames": int(metrics["frames"][-1]),
            "solved": bool(metrics["return_window_mean"][-1] >= 475),
            "train_fps": round(float(metrics["fps"][-1]), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    report = {"benchmark": "solve CartPole-v1 (window mean >= 475)", "layouts": []}
    for name, ranks, job in LAYOUTS:
        runs = [one_run(ranks, job, seed) for seed in args.seeds]
        report["layouts"].append({
            "layout": name, "ranks": ranks, "job": f"jobs/{job}", "runs": runs,
            "all_solved": all(r["solved"] for r in runs),
            "median_seconds": statistics.median(r["seconds_from_launch"] for r in runs),
            "median_frames": statistics.median(r["frames"] for r in runs)})
    serial = report["layouts"][0]["median_seconds"]
    for entry in report["layouts"]:
        entry["speedup_vs_serial"] = round(serial / entry["median_seconds"], 2)
    emit(report, args.out)


if __name__ == "__main__":
    main()
