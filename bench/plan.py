"""How long planning a 100,000-rank layout takes (layout + fan-in + warnings + traffic), as JSON.

The target is under one second. A same-run baseline (one argsort over the ranks, a floor for any
O(n log n) plan) shows how much of the time is machine speed.

    .venv/bin/python bench/plan.py [--world-size 100000] [--ranks-per-node 128] [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
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
    report = {"benchmark": "hpcrl plan", "world_size": args.world_size, "ranks_per_node": args.ranks_per_node,
              "roles": ROLES, "plan_seconds": round(plan_s, 4), "budget_seconds": 1.0,
              "fraction_of_budget": round(plan_s / 1.0, 3), "argsort_baseline_seconds": round(baseline_s, 5),
              "ratio_to_argsort": round(plan_s / baseline_s, 1)}
    emit(report, args.out)


if __name__ == "__main__":
    main()
