"""Time to solve CartPole-v1 (mean return of the last >= 20 episodes >= 475) or Pendulum-v1 (>= -200)
from launch: hpcrl's layouts against Stable-Baselines3, measured by this script in the same run:
PPO against SB3 PPO (`--algo ppo`, the default), APPO (jobs/cartpole_appo.yaml) against SB3 PPO
(`--algo appo`), DQN against SB3 DQN (`--algo dqn`), or SAC on Pendulum-v1 (jobs/pendulum_sac.yaml)
against SB3 SAC with rl-zoo's Pendulum-v1 settings (`--algo sac`, bench/sb3_pendulum.py).

Every run is a fresh process timed from launch to exit, so start-up (imports, MPI, env creation)
counts the same for every system: hpcrl's shipped jobs through the real launcher
(`scripts/mpirun.sh`, even for world size 1), and SB3 2.9.2 PPO with the rl-zoo CartPole-v1
hyperparameters (`bench/sb3_cartpole.py`, torch threads 1 like hpcrl, stopped at the target by a
callback), or SB3 DQN with rl-zoo's CartPole-v1 DQN hyperparameters. Seeds are interleaved over the systems so a noisy moment of a shared machine does not
hit one system only. Prints JSON: per system the seconds and frames of each seed and their
medians; per hpcrl layout `ratio_to_sb3` = hpcrl median seconds / SB3 median seconds (target
<= 1) and the speed-up against the serial layout.

    .venv/bin/python bench/solve.py [--seeds 1 2 3] [--layouts serial 4ranks 6ranks] [--out FILE]
    .venv/bin/python bench/solve.py --seeds 1 --layouts serial       # a quick check (~1 minute)
    .venv/bin/python bench/solve.py --algo appo --out bench/results/solve_appo.json
    .venv/bin/python bench/solve.py --algo dqn --out bench/results/solve_dqn.json
    .venv/bin/python bench/solve.py --algo sac --out bench/results/solve_sac.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402
from hpcrl.io.metrics import read_metrics, read_startup  # noqa: E402

TARGETS = {"ppo": 475, "appo": 475, "dqn": 475, "sac": -200}  # the mean return that solves the algorithm's env
LAYOUTS = {  # algo -> key: (description, ranks, job); serial is the baseline of speedup_vs_serial
    "ppo": {
        "serial": ("serial", 1, "cartpole_ppo.yaml"),
        "4ranks": ("4 ranks: 1 learner, 1 inference, 2 env", 4, "cartpole_ppo.yaml"),
        "6ranks": ("6 ranks: 2 learners, 2 inference, 2 env", 6, "cartpole_ppo_2learners.yaml"),
    },
    "appo": {  # against SB3's (synchronous) PPO: the same hyperparameters, asynchronous collection
        "serial": ("serial", 1, "cartpole_appo.yaml"),
        "4ranks": ("4 ranks: 1 learner, 1 inference, 2 env", 4, "cartpole_appo.yaml"),
    },
    "dqn": {
        "serial": ("serial", 1, "cartpole_dqn.yaml"),
        "4ranks": ("4 ranks: 1 learner (with the replay), 1 inference, 2 env", 4, "cartpole_dqn.yaml"),
    },
    "sac": {
        "serial": ("serial", 1, "pendulum_sac.yaml"),
        "4ranks": ("4 ranks: 1 learner (with the replay), 1 inference, 2 env", 4, "pendulum_sac.yaml"),
    },
}
SB3_ALGO = {"ppo": "ppo", "appo": "ppo", "dqn": "dqn", "sac": "sac"}  # the SB3 algorithm each is compared with
SB3_SCRIPT = {"sac": "bench/sb3_pendulum.py"}  # else bench/sb3_cartpole.py
ENV = {"sac": "Pendulum-v1"}  # else CartPole-v1
SB3 = "stable-baselines3 2.9.2 {algo}, rl-zoo {env} hyperparameters ({script} --algo {algo_lower})"


def timed(cmd: list[str], what: str) -> tuple[float, str]:
    """Run `cmd` from the repository root; its wall seconds from launch to exit, and its stdout."""
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (status {result.returncode}):\n{result.stderr[-2000:]}")
    return seconds, result.stdout


def hpcrl_run(ranks: int, job: str, seed: int, target: float) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", str(ranks), sys.executable, "-m", "hpcrl", "run",
               str(REPO / "jobs" / job), "--set", f"run.output_dir={out}", "--set", f"run.seed={seed}",
               "--set", f"run.target_return={target}"]
        seconds, _ = timed(cmd, f"hpcrl {job} on {ranks} ranks, seed {seed}")
        path = str(next(Path(out).iterdir()) / "metrics.h5")
        metrics, startup = read_metrics(path), read_startup(path)
    return {"seed": seed, "seconds_from_launch": round(seconds, 2), "frames": int(metrics["frames"][-1]),
            "solved": bool(metrics["return_window_mean"][-1] >= target),
            "train_fps": round(float(metrics["fps"][-1]), 1),
            # per start-up mark (core/startup.py), the last rank's seconds since its exec
            "startup": {mark: round(float(np.nanmax(s)), 3) for mark, s in startup.items() if not np.isnan(s).all()}}


def sb3_run(algo: str, seed: int, target: float) -> dict:
    cmd = [sys.executable, str(REPO / SB3_SCRIPT.get(algo, "bench/sb3_cartpole.py")), "--algo", algo,
           "--seed", str(seed), "--target", str(target)]
    seconds, stdout = timed(cmd, f"SB3 seed {seed}")
    result = json.loads(stdout.strip().splitlines()[-1])
    return {"seed": seed, "seconds_from_launch": round(seconds, 2), "frames": result["frames"],
            "solved": result["solved"], "hyperparameters": result["hyperparameters"],
            "startup": result["startup"], "update_s_per_frame": result["update_s_per_frame"]}


def summary(runs: list[dict]) -> dict:
    out = {"runs": runs, "all_solved": all(r["solved"] for r in runs),
           "median_seconds": statistics.median(r["seconds_from_launch"] for r in runs),
           "median_frames": statistics.median(r["frames"] for r in runs)}
    first = [r["startup"].get("first_update") for r in runs if r.get("startup")]
    if first and None not in first:  # seconds from exec to the first update (hpcrl: its last learner's)
        out["median_first_update_s"] = round(statistics.median(first), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds to run (default: 1 2 3)")
    parser.add_argument("--algo", choices=list(LAYOUTS), default="ppo",
                        help="ppo (default), appo (jobs/cartpole_appo.yaml against SB3 PPO), dqn, or sac "
                             "(Pendulum-v1)")
    parser.add_argument("--layouts", nargs="+", choices=["serial", "4ranks", "6ranks"],
                        help="hpcrl layouts to run (default: all of the algorithm's)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    layouts_of = LAYOUTS[args.algo]
    args.layouts = args.layouts or list(layouts_of)
    unknown = [key for key in args.layouts if key not in layouts_of]
    if unknown:
        parser.error(f"--algo {args.algo} has no layout {', '.join(unknown)} (it has {', '.join(layouts_of)})")
    target, env = TARGETS[args.algo], ENV.get(args.algo, "CartPole-v1")
    runs: dict[str, list[dict]] = {key: [] for key in [*args.layouts, "sb3"]}
    for seed in args.seeds:  # interleaved: every system sees the same stretch of machine noise
        for key in args.layouts:
            _, ranks, job = layouts_of[key]
            runs[key].append(hpcrl_run(ranks, job, seed, target))
        runs["sb3"].append(sb3_run(SB3_ALGO[args.algo], seed, target))
    algo = SB3_ALGO[args.algo]
    sb3 = {"system": SB3.format(algo=algo.upper(), env=env, script=SB3_SCRIPT.get(algo, "bench/sb3_cartpole.py"),
                                algo_lower=algo),
           "hyperparameters": runs["sb3"][0].pop("hyperparameters"), **summary(runs["sb3"])}
    for run in runs["sb3"]:
        run.pop("hyperparameters", None)
    layouts = []
    for key in args.layouts:
        name, ranks, job = layouts_of[key]
        entry = {"layout": name, "key": key, "ranks": ranks, "job": f"jobs/{job}", **summary(runs[key])}
        entry["ratio_to_sb3"] = round(entry["median_seconds"] / sb3["median_seconds"], 2)
        layouts.append(entry)
    if "serial" in args.layouts:
        serial = layouts[args.layouts.index("serial")]["median_seconds"]
        for entry in layouts:
            entry["speedup_vs_serial"] = round(serial / entry["median_seconds"], 2)
    emit({"benchmark": f"solve {env} (mean return of the last >= 20 episodes >= {target}) from launch",
          "algo": args.algo, "seeds": args.seeds, "target_ratio_to_sb3": "<= 1", "sb3": sb3, "layouts": layouts}, args.out)


if __name__ == "__main__":
    main()
