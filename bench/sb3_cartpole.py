"""Stable-Baselines3 PPO or DQN on CartPole-v1 with the rl-zoo hyperparameters, stopped at the
target: the baseline that bench/solve.py launches as a subprocess, timing it from launch like hpcrl.

Prints one JSON line: seed, frames at the stop, whether the target was reached, the window mean.

    .venv/bin/python bench/sb3_cartpole.py --seed 1 [--algo ppo|dqn] [--target 475]

Stable-Baselines3 is a benchmark extra (`pip install -e .[bench]`), never a dependency of hpcrl.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hpcrl.core.startup import StartupClock  # noqa: E402 (stdlib only: the clock hpcrl's ranks use)

CLOCK = StartupClock()  # seconds since this process was created, as hpcrl's start-up marks

import torch  # noqa: E402
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import LinearSchedule  # noqa: E402

IMPORTED_S = CLOCK.since_created()

# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 (tuned). lin_X is X * progress_remaining over
# n_timesteps, so learn() is given the full budget and the callback stops it early.
N_ENVS = 8
N_TIMESTEPS = 100_000
PPO_KWARGS = dict(policy="MlpPolicy", n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                  ent_coef=0.0, learning_rate=LinearSchedule(1e-3, 0.0, 1.0), clip_range=LinearSchedule(0.2, 0.0, 1.0))
# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1: one env, 128 gradient steps every 256 env
# steps, epsilon 1 -> 0.04 over the first 8,000 steps (16% of its 50,000). Its 50,000-step budget
# is doubled here, with the same 8,000-step exploration, because with 50,000 none of seeds 1-3
# reached 475 (the window mean of training episodes) and there would be no time to solve to compare.
DQN_TIMESTEPS = 100_000
DQN_KWARGS = dict(policy="MlpPolicy", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                  gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                  exploration_fraction=0.08, exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))
WINDOW_EPISODES = 20  # as hpcrl's target_return: the mean return of the last 20 finished episodes


class StopAtTarget(BaseCallback):
    """Stops learn() once the last WINDOW_EPISODES finished episodes average at least `target`.
    Checked after every vector step, the earliest SB3 can stop (hpcrl checks after each update)."""

    def __init__(self, target: float) -> None:
        super().__init__()
        self.target = target
        self.returns: deque = deque(maxlen=WINDOW_EPISODES)

    def window_mean(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")

    def reached(self) -> bool:
        return len(self.returns) == WINDOW_EPISODES and self.window_mean() >= self.target

    def _on_step(self) -> bool:
        # the Monitor wrapper of make_vec_env puts each finished episode's return in info["episode"]
        finished = [info["episode"]["r"] for info in self.locals["infos"] if "episode" in info]
        self.returns.extend(float(r) for r in finished)
        return not (finished and self.reached())


def timed_updates(model) -> dict:
    """Wrap `model.train` (SB3's update: PPO's every epoch and minibatch of one rollout, DQN's
    gradient steps, which it passes as arguments) to time each call; the dict fills as learn()
    runs."""
    times = {"count": 0, "seconds": 0.0, "first_end": float("nan")}
    train = model.train

    def timed(*args, **kwargs) -> None:
        start = time.perf_counter()
        train(*args, **kwargs)
        times["seconds"] += time.perf_counter() - start
        times["count"] += 1
        if times["count"] == 1:
            times["first_end"] = CLOCK.since_created()
    model.train = timed
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--algo", choices=["ppo", "dqn"], default="ppo")
    parser.add_argument("--target", type=float, default=475.0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as hpcrl (run.torch_threads: 1)
    algo, n_envs, timesteps, kwargs = ((PPO, N_ENVS, N_TIMESTEPS, PPO_KWARGS) if args.algo == "ppo" else
                                       (DQN, 1, DQN_TIMESTEPS, DQN_KWARGS))
    envs = make_vec_env("CartPole-v1", n_envs=n_envs, seed=args.seed)
    model = algo(env=envs, seed=args.seed, device="cpu", verbose=0, **kwargs)
    built_s = CLOCK.since_created()
    updates = timed_updates(model)
    stop = StopAtTarget(args.target)
    model.learn(total_timesteps=timesteps, callback=stop)
    frames_per_update = n_envs * kwargs["n_steps"] if args.algo == "ppo" else None
    print(json.dumps({"seed": args.seed, "frames": int(model.num_timesteps), "solved": stop.reached(),
                      "window_mean": round(stop.window_mean(), 1),
                      # seconds since exec: imports done, env and model built, the first update done
                      "startup": {"imports": round(IMPORTED_S, 3), "built": round(built_s, 3),
                                  "first_update": round(updates["first_end"], 3)},
                      "update_s_per_frame": (updates["seconds"] / updates["count"] / frames_per_update
                                             if frames_per_update and updates["count"] else None),
                      "hyperparameters": {"n_envs": n_envs, "n_timesteps": timesteps,
                                          **{k: repr(v) if callable(v) else v for k, v in kwargs.items()}}}))


if __name__ == "__main__":
    main()
