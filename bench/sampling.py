"""Sampling throughput: env (+ inference) ranks run the policy while the learner takes fragments
without training (algo.train: false, async mode, so nobody waits for weights), as JSON.

The baseline, measured in the same run around each layout (before and after it, the mean of the
two): one process stepping the same vector of envs with the same policy forward in a tight loop
(no MPI, no fragments). For each layout

    ratio          = hpcrl frames/s / (baseline frames/s x sampling processes)      (target >= 0.8)
    ratio_per_core = hpcrl frames/s / (baseline frames/s x min(sampling processes, cores left))

where sampling processes are the env ranks plus the inference ranks, and cores left are the
machine's cores minus the learner's. On a machine with fewer cores than ranks the first ratio
measures oversubscription as much as hpcrl; the second is what the hardware allows.

    .venv/bin/python bench/sampling.py [--config jobs/cartpole_appo.yaml] [--seconds 12] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit, run_rate  # noqa: E402

# name, world size, roles, sampling processes (env + inference ranks)
LAYOUTS = [
    ("inline: 1 learner + 2 env ranks", 3, "{learner: {ranks: 1}, inference: {ranks: 0}, env: {ranks: 2}}", 2),
    ("remote: 1 learner + 1 inference + 2 env ranks", 4,
     "{learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: 2}}", 3),
]


def tight_loop(config: str, seconds: float) -> float:
    """Frames/s of one process: policy forward, then env step, on one vector of the config's size."""
    import numpy as np
    import torch

    from hpcrl.core.config import load_config
    from hpcrl.envs import make_vector_env, env_spaces
    from hpcrl.models import PolicyRunner, build_model
    cfg, _ = load_config(config)
    torch.set_num_threads(cfg.run.torch_threads)
    spaces = env_spaces(cfg.env)
    envs, obs = make_vector_env(cfg.env, seed=0)
    runner = PolicyRunner(build_model(spaces, cfg.model), "cpu", seed=0)
    n = cfg.env.num_envs
    actions = np.zeros((n, *spaces.action_shape), dtype=spaces.action_dtype)
    out = {"actions": actions, "logp": np.zeros(n, np.float32), "values": np.zeros(n, np.float32)}
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            runner.act(obs, out)
            obs = envs.step(actions)[0]
        steps += 50
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * n / elapsed


def hpcrl_rate(config: str, ranks: int, roles: str, seconds: float, out_dir: str) -> dict:
    """Frames/s of a real run with algo.train false (async, so nobody waits for weights)."""
    return run_rate(config, ranks, seconds, out_dir, f"sampling{ranks}",
                    ["algo.mode=async", "algo.train=false", f"roles={roles}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "jobs/cartpole_appo.yaml"))
    parser.add_argument("--seconds", type=float, default=12.0, help="measured seconds per case")
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    layouts = []
    # The tight loop runs right before and right after each layout, and the layout is set against
    # the mean of the two: on a shared machine the speed of a core drifts by a third within
    # minutes, and a baseline taken once at the start would put that drift into the ratios.
    loops = [tight_loop(args.config, args.seconds / 2)]
    with tempfile.TemporaryDirectory() as tmp:
        for name, ranks, roles, sampling in LAYOUTS:
            rate = hpcrl_rate(args.config, ranks, roles, args.seconds, tmp)
            loops.append(tight_loop(args.config, args.seconds / 2))
            baseline = (loops[-2] + loops[-1]) / 2
            usable = max(1, min(sampling, cores - 1))
            layouts.append({"layout": name, "world_size": ranks, "sampling_processes": sampling, **rate,
                            "tight_loop_frames_per_s": round(baseline, 1),
                            "ratio": round(rate["frames_per_s"] / (baseline * sampling), 3),
                            "ratio_per_core": round(rate["frames_per_s"] / (baseline * usable), 3)})
    emit({"benchmark": "sampling", "config": os.path.relpath(args.config, REPO),
          "tight_loop_runs_frames_per_s": [round(x, 1) for x in loops], "layouts": layouts, "target_ratio": 0.8},
         args.out)


if __name__ == "__main__":
    main()
