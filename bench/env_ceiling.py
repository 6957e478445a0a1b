"""Bare environment steps per second with random actions in one process, as JSON: the ceiling that
sampling (env + inference + messages) can at best reach on one core.

Measured, each for --seconds of stepping after a warm-up, median of --repeats:
- hpcrl: the vector an env rank steps, `hpcrl.envs.make_vector_env(cfg.env, seed)`, for the
  config's env (its id, num_envs and whatever else `env:` sets, the backend included);
- gymnasium references for the same env id: one env in a plain step/reset loop, and
  `gymnasium.vector.SyncVectorEnv` of the same num_envs;
- where the env has a numpy-vectorised implementation (CartPole-v1 does):
  `gymnasium.make_vec(id, num_envs=n, vectorization_mode="vector_entry_point")` at 64/256/1024 envs.
Random actions come from the env's action space (`sample()`), drawn before the clock starts.
`frames_per_s` counts single-env steps (vector steps x num_envs).

    .venv/bin/python bench/env_ceiling.py [--config jobs/cartpole_ppo.yaml] [--env-id ID] [--num-envs N]
                                          [--set KEY=VALUE ...] [--seconds 1] [--repeats 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402
from hpcrl.core.config import load_config  # noqa: E402
from hpcrl.envs import make_vector_env  # noqa: E402

NUMPY_VECTOR_SIZES = (64, 256, 1024)
ACTION_POOL = 64  # pre-drawn random actions, cycled: the draw stays out of the timing


def action_pool(space: gym.Space, seed: int) -> list:
    space.seed(seed)
    return [space.sample() for _ in range(ACTION_POOL)]


def steps_per_s(step, seconds: float, repeats: int, warmup: int = 100) -> float:
    """Median over `repeats` windows of `seconds` of calls of `step()` per second."""
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            step()
            calls += 1
        rates.append(calls / elapsed)
    return statistics.median(rates)


def vector_case(name: str, envs, num_envs: int, seconds: float, repeats: int, seed: int) -> dict:
    """A vector env that resets itself; `envs` is already reset."""
    actions = action_pool(envs.action_space, seed)
    i = 0

    def step():
        nonlocal i
        envs.step(actions[i % ACTION_POOL])
        i += 1

    rate = steps_per_s(step, seconds, repeats)
    envs.close()
    return {"case": name, "num_envs": num_envs, "vector_steps_per_s": round(rate, 1),
            "frames_per_s": round(rate * num_envs, 1)}


def single_env_case(env_id: str, kwargs: dict, seconds: float, repeats: int, seed: int) -> dict:
    env = gym.make(env_id, **kwargs)
    env.reset(seed=seed)
    actions = action_pool(env.action_space, seed)
    i = 0

    def step():
        nonlocal i
        _, _, terminated, truncated, _ = env.step(actions[i % ACTION_POOL])
        if terminated or truncated:
            env.reset()
        i += 1

    rate = steps_per_s(step, seconds, repeats)
    env.close()
    return {"case": "gymnasium single env, step/reset loop", "num_envs": 1, "vector_steps_per_s": round(rate, 1),
            "frames_per_s": round(rate, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "jobs/cartpole_ppo.yaml"), help="job whose env: section to use")
    parser.add_argument("--env-id", help="override env.id")
    parser.add_argument("--num-envs", type=int, help="override env.num_envs (the vector size)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config value, as hpcrl run --set (e.g. env.kwargs=...)")
    parser.add_argument("--seconds", type=float, default=1.0, help="stepping time per measurement window")
    parser.add_argument("--repeats", type=int, default=3, help="windows per case (the median is reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    overrides = list(args.set)
    if args.env_id:
        overrides.append(f"env.id={args.env_id}")
    if args.num_envs:
        overrides.append(f"env.num_envs={args.num_envs}")
    cfg, _ = load_config(args.config, tuple(overrides))
    env_cfg, n, run = cfg.env, cfg.env.num_envs, (args.seconds, args.repeats, args.seed)

    envs, _ = make_vector_env(env_cfg, args.seed)
    cases = [vector_case("hpcrl make_vector_env", envs, n, *run)]
    cases.append(single_env_case(env_cfg.id, env_cfg.kwargs, *run))
    sync = gym.vector.SyncVectorEnv([lambda: gym.make(env_cfg.id, **env_cfg.kwargs) for _ in range(n)])
    sync.reset(seed=args.seed)
    cases.append(vector_case("gymnasium SyncVectorEnv", sync, n, *run))
    if gym.spec(env_cfg.id).vector_entry_point is not None:
        for size in NUMPY_VECTOR_SIZES:
            vec = gym.make_vec(env_cfg.id, num_envs=size, vectorization_mode="vector_entry_point", **env_cfg.kwargs)
            vec.reset(seed=args.seed)
            cases.append(vector_case("gymnasium numpy-vectorised (vector_entry_point)", vec, size, *run))
    emit({"benchmark": "env ceiling: bare env steps/s with random actions, one process",
          "config": args.config, "env_id": env_cfg.id, "env": dataclasses.asdict(env_cfg),
          "seconds_per_window": args.seconds, "repeats": args.repeats,
          "hpcrl_vs_sync_vector": round(cases[0]["frames_per_s"] / cases[2]["frames_per_s"], 2),
          "cases": cases}, args.out)


if __name__ == "__main__":
    main()
