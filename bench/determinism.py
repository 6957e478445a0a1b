"""What repeatability costs: frames/s of a job with run.deterministic true (each request computed
alone on the policy holders, in fixed blocks) against false (a policy server batches every ready
request in one forward pass), measured in the same run, as JSON.

The two settings alternate, A B A B ... (`--rounds` of each), and each ratio is taken between
neighbours, so the drift of a shared machine's speed over minutes falls on both sides alike; the
report gives every round's ratio and their median.

    .venv/bin/python bench/determinism.py [--seconds 20] [--rounds 2] [--out bench/results/determinism.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit, run_rate  # noqa: E402

# name, config, ranks, overrides, measured seconds per run as a multiple of --seconds (Breakout
# updates every few seconds here: a window must hold enough of them)
JOBS = [
    ("CartPole PPO (sync), 4 ranks: 1 learner, 1 inference, 2 env", "jobs/cartpole_ppo.yaml", 4, [], 1),
    ("Breakout APPO (async), 4 ranks: 1 learner, 1 inference, 2 env", "jobs/breakout_appo.yaml", 4, [], 3),
]


def measure(config: str, ranks: int, overrides: list[str], seconds: float, rounds: int, out_dir: str) -> dict:
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for deterministic in (True, False):
            rate = run_rate(str(REPO / config), ranks, seconds, out_dir, f"det{deterministic}{r}",
                            [*overrides, f"run.deterministic={str(deterministic).lower()}"])
            rates[deterministic].append(rate["frames_per_s"])
    ratios = [d / n for d, n in zip(rates[True], rates[False])]
    return {"deterministic_frames_per_s": [round(x, 1) for x in rates[True]],
            "batched_frames_per_s": [round(x, 1) for x in rates[False]],
            "ratios": [round(x, 3) for x in ratios], "ratio": round(statistics.median(ratios), 3),
            "cost_percent": round(100 * (1 - statistics.median(ratios)), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each setting, alternating")
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config, ranks, overrides, longer in JOBS:
            seconds = args.seconds * longer
            jobs.append({"job": name, "config": config, "world_size": ranks, "seconds_per_run": seconds,
                         **measure(config, ranks, overrides, seconds, args.rounds, tmp)})
    emit({"benchmark": "determinism", "what": "frames/s with run.deterministic true / false, same run",
          "jobs": jobs, "default_if_cost_at_most_percent": 5.0}, args.out)


if __name__ == "__main__":
    main()
