"""Stable-Baselines3 SAC on HalfCheetah-v5 with rl-zoo's settings for a fixed budget: the baseline
beside which jobs/results/halfcheetah_sac/ publishes hpcrl's run. Every finished training
episode's (timestep, return) goes into the JSON it writes, so both curves are drawn alike and
compared by the same number: the mean return of the last 20 episodes at the budget (hpcrl's
`return_window_mean`).

    .venv/bin/python bench/sb3_halfcheetah.py --seed 1 --steps 300000 --out bench/results/halfcheetah_sac_sb3.json

Stable-Baselines3 is a benchmark extra (`pip install -e .[bench]`), MuJoCo the `mujoco` extra.
About an hour and a half of one core for 300,000 steps on this project's machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sb3_cartpole import WINDOW_EPISODES  # noqa: E402 (the window hpcrl's return_window_mean uses)

import torch  # noqa: E402
from stable_baselines3 import SAC  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

# rl-baselines3-zoo hyperparams/sac.yml, HalfCheetah-v3/v4: MlpPolicy, 10,000 random steps first;
# SB3's defaults besides (learning rate 3e-4, buffer 1e6, batch 256, tau 0.005, gamma 0.99, one
# gradient step per env step, [256, 256], entropy coefficient tuned towards -|A|), as
# jobs/halfcheetah_sac.yaml
KWARGS = dict(policy="MlpPolicy", learning_starts=10_000)


class Episodes(BaseCallback):
    """Every finished episode: (timesteps so far, return, seconds since learn() began)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, float, float]] = []
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:  # the Monitor wrapper of make_vec_env
                self.rows.append((int(self.num_timesteps), float(info["episode"]["r"]),
                                  round(time.perf_counter() - self.start, 1)))
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as hpcrl (run.torch_threads: 1)
    model = SAC(env=make_vec_env("HalfCheetah-v5", n_envs=1, seed=args.seed), seed=args.seed, device="cpu",
                verbose=0, **KWARGS)
    episodes = Episodes()
    model.learn(total_timesteps=args.steps, callback=episodes)
    returns = [r for _, r, _ in episodes.rows]
    result = {"library": "stable-baselines3", "algo": "sac", "env": "HalfCheetah-v5", "seed": args.seed,
              "steps": args.steps, "window_episodes": WINDOW_EPISODES,
              "return_window_mean": round(sum(returns[-WINDOW_EPISODES:]) / min(len(returns), WINDOW_EPISODES), 1),
              "seconds": episodes.rows[-1][2] if episodes.rows else None,
              "hyperparameters": {k: repr(v) for k, v in KWARGS.items()},
              "episodes": [list(row) for row in episodes.rows]}
    Path(args.out).write_text(json.dumps(result) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "episodes"}))


if __name__ == "__main__":
    main()
