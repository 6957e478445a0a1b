"""How long planning a 100,000-rank layout takes (layout + fan-in + warnings + traffic), as JSON.

The target is under one second. A same-run baseline (one argsort over the ranks, a floor for any
O(n log n) plan) shows how much of the time is machine speed. And the whole command, `python -m
hpcrl plan jobs/cartpole_ppo.yaml` at that size, interpreter start and imports included: best of 5
(the least disturbed run on a shared machine), against a budget of 1.5 s; it loads neither torch nor
mpi4py (tests/test_packaging.py).

    .venv/bin/python bench/plan.py [--world-size 100000] [--ranks-per-node 128] [--out FILE]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit, median_seconds  # noqa: E402
from hpcrl.core.config import parse_config  # noqa: E402
from hpcrl.envs import EnvSpaces  # noqa: E402
from hpcrl.core.layout import plan_layout, simulated_nodes  # noqa: E402
from hpcrl.core.sizing import Sizes, traffic, warnings  # noqa: E402

ROLES = "roles: {learner: {ranks: 64}, inference: {per_node: 2}, env: {ranks: rest}}"
JOB = "jobs/cartpole_ppo.yaml"


def command_seconds(world_size: int, ranks_per_node: int, repeats: int = 5) -> float:
    """The fastest of `repeats` runs of `python -m hpcrl plan JOB` at this size, start to exit."""
    cmd = [sys.executable, "-m", "hpcrl", "plan", JOB, "--world-size", str(world_size),
           "--ranks-per-node", str(ranks_per_node)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=100_000)
    parser.add_argument("--ranks-per-node", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args()
    cfg = parse_config(ROLES)
    spaces = EnvSpaces(obs_shape=(4,), obs_dtype="float32", num_actions=2)
    nodes = simulated_nodes(args.world_size, args.ranks_per_node)

    def plan():
        layout = plan_layout(cfg.roles, args.world_size, nodes)
        warnings(cfg, layout)
        traffic(cfg, layout, Sizes.of(cfg, layout), spaces, 9_155, 1000.0)

    plan_s = median_seconds(plan)
    baseline_s = median_seconds(lambda: np.argsort(np.random.default_rng(0).random(args.world_size)))
    command_s = command_seconds(args.world_size, args.ranks_per_node)
    report = {"benchmark": "hpcrl plan", "world_size": args.world_size, "ranks_per_node": args.ranks_per_node,
              "roles": ROLES, "plan_seconds": round(plan_s, 4), "budget_seconds": 1.0,
              "fraction_of_budget": round(plan_s / 1.0, 3), "argsort_baseline_seconds": round(baseline_s, 5),
              "ratio_to_argsort": round(plan_s / baseline_s, 1), "command": f"python -m hpcrl plan {JOB}",
              "command_seconds_best_of_5": round(command_s, 3), "command_budget_seconds": 1.5}
    emit(report, args.out)


if __name__ == "__main__":
    main()
