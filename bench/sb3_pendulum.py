"""Stable-Baselines3 SAC or TD3 on Pendulum-v1 with rl-zoo's hyperparameters, stopped at the target:
the baseline that `bench/solve.py --algo sac` (or td3) launches as a subprocess, timing it from
launch like hpcrl. Prints one JSON line, as bench/sb3_cartpole.py does.

    .venv/bin/python bench/sb3_pendulum.py --seed 1 [--algo sac|td3] [--target -200]

Stable-Baselines3 is a benchmark extra (`pip install -e .[bench]`), never a dependency of hpcrl.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sb3_cartpole import CLOCK, IMPORTED_S, StopAtTarget, timed_updates  # noqa: E402 (the clock starts there)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import SAC, TD3  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.noise import NormalActionNoise  # noqa: E402

# rl-baselines3-zoo hyperparams/sac.yml and td3.yml, Pendulum-v1: 20,000 steps, learning rate 1e-3;
# SB3's defaults besides (buffer 1e6, 100 random steps, batch 256, tau 0.005, gamma 0.99, one gradient
# step per env step, [256, 256] for SAC; TD3: [400, 300], Gaussian action noise of std 0.1)
N_TIMESTEPS = 20_000
KWARGS = {"sac": dict(policy="MlpPolicy", learning_rate=1e-3),
          "td3": dict(policy="MlpPolicy", learning_rate=1e-3, gamma=0.98, buffer_size=200_000, learning_starts=10_000,
                      gradient_steps=1, train_freq=1, policy_kwargs=dict(net_arch=[400, 300]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--algo", choices=list(KWARGS), default="sac")
    parser.add_argument("--target", type=float, default=-200.0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as hpcrl (run.torch_threads: 1)
    envs = make_vec_env("Pendulum-v1", n_envs=1, seed=args.seed)
    kwargs = dict(KWARGS[args.algo])
    if args.algo == "td3":
        kwargs["action_noise"] = NormalActionNoise(mean=np.zeros(1), sigma=0.1 * np.ones(1))
    model = (SAC if args.algo == "sac" else TD3)(env=envs, seed=args.seed, device="cpu", verbose=0, **kwargs)
    built_s = CLOCK.since_created()
    updates = timed_updates(model)
    stop = StopAtTarget(args.target)
    model.learn(total_timesteps=N_TIMESTEPS, callback=stop)
    print(json.dumps({"seed": args.seed, "frames": int(model.num_timesteps), "solved": stop.reached(),
                      "window_mean": round(stop.window_mean(), 1),
                      "startup": {"imports": round(IMPORTED_S, 3), "built": round(built_s, 3),
                                  "first_update": round(updates["first_end"], 3)},
                      "update_s_per_frame": updates["seconds"] / max(int(model.num_timesteps), 1),
                      "hyperparameters": {"n_envs": 1, "n_timesteps": N_TIMESTEPS,
                                          **{k: repr(v) for k, v in kwargs.items()}}}))


if __name__ == "__main__":
    main()
