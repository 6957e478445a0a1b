"""HalfCheetah-v5 with SAC at a fixed budget, hpcrl beside Stable-Baselines3 on this machine and
beside the figures SB3 and CleanRL publish: what jobs/results/halfcheetah_sac/ shows.

Both runs are judged by one number: the mean return of the last 20 training episodes once the
budget's frames are in (hpcrl's `return_window_mean`; SB3's from the episodes its Monitor logs).
Writes summary.json and returns.png (both curves) into --out-dir, and prints the summary as JSON.

    mpirun -n 4 python -m hpcrl run jobs/halfcheetah_sac.yaml --set run.total_frames=300000
    .venv/bin/python bench/sb3_halfcheetah.py --steps 300000 --out bench/results/halfcheetah_sac_sb3.json
    .venv/bin/python bench/halfcheetah_sac.py --run-dir runs/halfcheetah_sac \\
        --sb3 bench/results/halfcheetah_sac_sb3.json --out-dir jobs/results/halfcheetah_sac
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402
from sb3_cartpole import WINDOW_EPISODES  # noqa: E402
from hpcrl.io.metrics import read_metrics  # noqa: E402

# What the libraries publish, quoted with their source. Neither gives a number at 300k steps in
# text (their curves are images); both give one at 1M.
PUBLISHED = [
    {"library": "CleanRL sac_continuous_action.py", "env": "HalfCheetah-v2", "steps": 1_000_000,
     "return": "9634.89 +- 1423.73", "measure": "training episodic return, 3 seeds",
     "source": "https://github.com/vwxyzjn/cleanrl/blob/master/docs/rl-algorithms/sac.md (Experiment results)"},
    {"library": "Stable-Baselines3 (rl-baselines3-zoo)", "env": "HalfCheetah-v3", "steps": 1_000_000,
     "return": "9535.45 +- 100.47", "measure": "the trained agent's deterministic play, 150 episodes, one run",
     "source": "https://github.com/DLR-RM/rl-baselines3-zoo/blob/master/benchmark.md"},
]


def sb3_window(episodes: list, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(timesteps, rolling mean of the last WINDOW_EPISODES returns at each episode's end, that mean
    at `steps`) from sb3_halfcheetah.py's episode rows."""
    t = np.array([row[0] for row in episodes if row[0] <= steps])
    r = np.array([row[1] for row in episodes if row[0] <= steps])
    means = np.array([r[max(0, i + 1 - WINDOW_EPISODES):i + 1].mean() for i in range(len(r))])
    return t, means, float(means[-1])


def hpcrl_window(metrics: dict, steps: int) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(frames, return_window_mean per update, the mean at the first update with `steps` frames in
    (or the last), those frames)."""
    frames, means = np.asarray(metrics["frames"]), np.asarray(metrics["return_window_mean"])
    at = min(int(np.searchsorted(frames, steps)), len(frames) - 1)
    return frames, means, float(means[at]), int(frames[at])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="hpcrl's run directory of jobs/halfcheetah_sac.yaml")
    parser.add_argument("--sb3", required=True, help="the JSON bench/sb3_halfcheetah.py wrote")
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--out-dir", default=str(REPO / "jobs" / "results" / "halfcheetah_sac"))
    args = parser.parse_args()
    sb3 = json.loads(Path(args.sb3).read_text())
    metrics = read_metrics(str(Path(args.run_dir) / "metrics.h5"))
    hf, hm, h_at, h_frames = hpcrl_window(metrics, args.steps)
    st, sm, s_at = sb3_window(sb3["episodes"], args.steps)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(hf, hm, label="hpcrl SAC (4 ranks)")
    ax.plot(st, sm, label="Stable-Baselines3 SAC")
    ax.set_xlabel("frames (env steps)")
    ax.set_ylabel(f"mean return, last {WINDOW_EPISODES} training episodes")
    ax.set_title("HalfCheetah-v5, SAC, rl-zoo settings, seed 1")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "returns.png", dpi=100)

    summary = {"env": "HalfCheetah-v5", "steps": args.steps, "window_episodes": WINDOW_EPISODES,
               "hpcrl": {"return_window_mean": round(h_at, 1), "at_frames": h_frames,
                         "wall_s": round(float(np.asarray(metrics["wall_time"])[-1]), 1),
                         "updates": int(np.asarray(metrics["policy_version"])[-1])},
               "sb3": {"return_window_mean": round(s_at, 1), "at_steps": int(st[-1]) if len(st) else 0,
                       "wall_s": sb3.get("seconds"), "seed": sb3.get("seed")},
               "ratio_hpcrl_to_sb3": round(h_at / s_at, 3) if s_at else None,
               "published": PUBLISHED}
    emit(summary, str(out / "summary.json"))


if __name__ == "__main__":
    main()
