"""Scale runs, oversubscribed on one machine: 64 ranks (async APPO, 4 learners) and 128 ranks
(sync PPO, 8 learners) of CartPole, each to a fixed frame budget. Prints JSON: wall time from
launch to exit, frames, updates, and what the metrics say about the streams (sample slots used,
credit waits, policy lag). On a 2-core machine these show that the wiring holds at that many
ranks (every rank talks to O(1) peers, shutdown completes), not throughput.

    .venv/bin/python bench/scale.py [--out bench/results/scale.json] [--only 64]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402

CASES = {  # world size: (mode, learners, inference ranks, frames)
    64: ("async", 4, 4, 60_000),
    128: ("sync", 8, 8, 60_000),
}


def config(out_dir: str, ranks: int) -> dict:
    mode, learners, inference, frames = CASES[ranks]
    return {"run": {"name": f"scale{ranks}", "output_dir": out_dir, "seed": 1, "total_frames": frames,
                    "log_interval_s": 30, "tensorboard": False, "hang_timeout_s": 600},
            "roles": {"learner": {"ranks": learners}, "inference": {"ranks": inference}, "env": {"ranks": "rest"}},
            "env": {"id": "CartPole-v1", "num_envs": 4},
            "algo": {"mode": mode, "rollout_length": 16, "epochs": 2, "num_minibatches": 2},
            "model": {"hidden_sizes": [32, 32]}}


def run(ranks: int) -> dict:
    from hpcrl.io.metrics import read_metrics
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scale.yaml"
        path.write_text(yaml.safe_dump(config(tmp, ranks)))
        start = time.perf_counter()
        result = subprocess.run(["bash", str(REPO / "scripts/mpirun.sh"), "-n", str(ranks), sys.executable, "-m",
                                 "hpcrl", "run", str(path)], cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"{ranks} ranks failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        m = read_metrics(str(Path(tmp) / f"scale{ranks}" / "metrics.h5"))
    mode, learners, inference, frames = CASES[ranks]
    return {"ranks": ranks, "mode": mode, "learners": learners, "inference": inference,
            "env_ranks": ranks - learners - inference, "wall_s": round(wall, 1), "frames": int(m["frames"][-1]),
            "updates": int(len(m["frames"])), "training_s": round(float(m["wall_time"][-1]), 1),
            "sample_slots_max": int(m["sample_slots_max"].max()),
            "env_credit_wait_fraction_mean": round(float(m["env_credit_wait_fraction"].mean()), 3),
            "policy_lag_max": int(m["policy_lag_max"].max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--only", type=int, choices=sorted(CASES))
    args = parser.parse_args()
    emit({"benchmark": "scale", "runs": [run(n) for n in ([args.only] if args.only else sorted(CASES))]}, args.out)


if __name__ == "__main__":
    main()
