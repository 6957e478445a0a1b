"""What repeatability costs: frames/s of a job with run.deterministic true (each request computed
alone on the policy holders, in fixed blocks) against false (a policy server batches every ready
request in one forward pass), measured in the same run, as JSON. For a replay job, what it needs
besides: sync rounds (algo.mode sync, a lockstep of actors and learners) against free-running
Ape-X (async) at the same replay ratio.

The two settings alternate, A B A B ... (`--rounds` of each), and each ratio is taken between
neighbours, so the drift of a shared machine's speed over minutes falls on both sides alike; the
report gives every round's ratio and their median.

    .venv/bin/python bench/determinism.py [--seconds 20] [--rounds 2] [--only DQN] [--out FILE.json]
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

REPEATS, BATCHED = ["run.deterministic=true"], ["run.deterministic=false"]
# name, config, ranks, the settings that repeat, those that do not, measured seconds per run as a
# multiple of --seconds (Breakout updates every few seconds here: a window must hold enough of them)
JOBS = [
    ("CartPole PPO (sync), 4 ranks: 1 learner, 1 inference, 2 env", "jobs/cartpole_ppo.yaml", 4, REPEATS, BATCHED, 1),
    ("Breakout APPO (async), 4 ranks: 1 learner, 1 inference, 2 env", "jobs/breakout_appo.yaml", 4, REPEATS,
     BATCHED, 3),
    ("CartPole DQN, replay ratio 32, 4 ranks: sync rounds against free-running Ape-X (async)",
     "jobs/cartpole_dqn.yaml", 4, ["algo.mode=sync", *REPEATS], ["algo.mode=async", *BATCHED], 1),
]


def measure(config: str, ranks: int, repeats: list[str], batched: list[str], seconds: float, rounds: int,
            out_dir: str) -> dict:
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for deterministic in (True, False):
            rate = run_rate(str(REPO / config), ranks, seconds, out_dir, f"det{deterministic}{r}",
                            repeats if deterministic else batched)
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
    parser.add_argument("--only", help="only the jobs whose name holds this text (e.g. DQN)")
    args = parser.parse_args()
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config, ranks, repeats, batched, longer in JOBS:
            if args.only and args.only not in name:
                continue
            seconds = args.seconds * longer
            jobs.append({"job": name, "config": config, "world_size": ranks, "seconds_per_run": seconds,
                         "repeatable_settings": repeats, "other_settings": batched,
                         **measure(config, ranks, repeats, batched, seconds, args.rounds, tmp)})
    emit({"benchmark": "determinism", "what": "frames/s with run.deterministic true / false, same run",
          "jobs": jobs, "default_if_cost_at_most_percent": 5.0}, args.out)


if __name__ == "__main__":
    main()
