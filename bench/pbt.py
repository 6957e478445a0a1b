"""Does population-based training recover from bad hyperparameters? jobs/cartpole_pbt.yaml (8
PPO members on CartPole-v1, half of them with a learning rate 30x too high or too low) run twice
in this script, each on 8 ranks of this machine:

- `pbt`: as shipped: every 8,192 frames of its own a member in the bottom quarter copies one of
  the top quarter, its learning rate perturbed by 0.8 or 1.25;
- `fixed`: the same members never judged (population.ready_frames above the budget), so each
  trains with its starting hyperparameters exactly as if run alone (a serial run repeats exactly
  for a seed; `--check-alone M` runs member M's own config.yaml alone and compares).

Per member: its own frames to a mean return of 475 (null: not within run.total_frames). The
issue's test: the best PBT member's frames against the median fixed member's. Also the frames
the whole population had spent when its first member got there (a copy's own frames leave out
what its parent trained before the copy; this count does not), and the exploit pause: the
seconds members' learner roots spent sending or receiving copies, over their training time. Writes summary.json and the two
plots (`hpcrl plot` of each population) into jobs/results/cartpole_pbt, and the summary to
bench/results/pbt.json too.

    .venv/bin/python bench/pbt.py [--seed 1] [--out-dir jobs/results/cartpole_pbt] [--check-alone 0]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402
from solve import timed  # noqa: E402
from hpcrl.core.population import EXPLOIT  # noqa: E402
from hpcrl.io.metrics import read_metrics  # noqa: E402

JOB = REPO / "jobs" / "cartpole_pbt.yaml"
MEMBERS, TARGET = 8, 475
NEVER = 10**12  # population.ready_frames: no member is ever judged


def run_population(out: Path, seed: int, *settings: str) -> tuple[float, Path]:
    cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", str(MEMBERS), sys.executable, "-m", "hpcrl", "run",
           str(JOB), "--set", f"run.output_dir={out}", "--set", f"run.seed={seed}", *settings]
    seconds, _ = timed(cmd, f"{JOB.name} {' '.join(settings)}")
    return seconds, out / "cartpole_pbt"


def solved_at(metrics: dict) -> int | None:
    """The member's own frames when it stopped at run.target_return (its mean return over at least
    20 episodes, as the run judges it: right after a copy the window holds fewer), or None."""
    solved = metrics["return_window_mean"][-1] >= TARGET
    return int(metrics["frames"][-1]) if solved else None


def population_frames_at(members: list[dict], wall_time: float) -> int:
    """Frames all members had trained by `wall_time` seconds of their runs (they start together)."""
    return int(sum(m["frames"][np.searchsorted(m["wall_time"], wall_time, side="right") - 1]
                   if m["wall_time"][0] <= wall_time else 0 for m in members))


def describe(pop_dir: Path, seconds: float) -> dict:
    members = [read_metrics(str(pop_dir / f"member{m}" / "metrics.h5")) for m in range(MEMBERS)]
    lineage = read_metrics(str(pop_dir / "metrics.h5"))
    frames = [solved_at(m) for m in members]
    solved = [(f, i) for i, f in enumerate(frames) if f is not None]
    out = {"seconds_from_launch": round(seconds, 1), "frames_to_target": frames,
           "solved": sum(f is not None for f in frames),
           "exploits": int((lineage["event"] == EXPLOIT).sum()),
           "final_lr": [float(m["lr"][-1]) for m in members],
           # the time members' learner roots spent sending or receiving copies, over their training time
           "exploit_pause_fraction": round(sum(float(m["exploit_pause_s"][-1]) for m in members)
                                           / sum(float(m["wall_time"][-1]) for m in members), 5)}
    if solved:
        best_frames, best = min(solved)
        first_time = float(members[best]["wall_time"][np.flatnonzero(members[best]["frames"] == best_frames)[0]])
        out.update(best_member=best, best_frames=best_frames,
                   population_frames_at_first_solve=population_frames_at(members, first_time))
    # a member that never got there counts as the whole budget (a lower bound on what it needs)
    budget = int(max(m["frames"][-1] for m in members))
    out["median_frames"] = statistics.median(f if f is not None else budget for f in frames)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", default=str(REPO / "jobs" / "results" / "cartpole_pbt"))
    parser.add_argument("--check-alone", type=int, metavar="M", help="also run member M alone and compare")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"job": str(JOB.relative_to(REPO)), "seed": args.seed, "target": TARGET}
    with tempfile.TemporaryDirectory() as tmp:
        for name, settings in (("pbt", ()), ("fixed", (f"population.ready_frames={NEVER}",))):
            seconds, pop_dir = run_population(Path(tmp) / name, args.seed, *[s for x in settings for s in ("--set", x)])
            report[name] = describe(pop_dir, seconds)
            subprocess.run([sys.executable, "-m", "hpcrl", "plot", str(pop_dir), "-o", str(out_dir / f"{name}.png")],
                           check=True, cwd=REPO, capture_output=True)
            if name == "fixed" and args.check_alone is not None:
                m = args.check_alone
                alone = Path(tmp) / "alone"
                config = pop_dir / f"member{m}" / "config.yaml"
                timed(["bash", str(REPO / "scripts/mpirun.sh"), "-n", "1", sys.executable, "-m", "hpcrl", "run",
                       str(config), "--set", f"run.output_dir={alone}"], f"member {m} alone")
                frames = solved_at(read_metrics(str(alone / f"member{m}" / "metrics.h5")))
                report["alone"] = {"member": m, "frames_to_target": frames,
                                   "same_as_in_the_population": frames == report["fixed"]["frames_to_target"][m]}
    pbt, fixed = report["pbt"], report["fixed"]
    report["best_pbt_below_median_fixed"] = pbt.get("best_frames") is not None and \
        pbt["best_frames"] < fixed["median_frames"]
    emit(report, str(out_dir / "summary.json"))
    (REPO / "bench" / "results" / "pbt.json").write_text((out_dir / "summary.json").read_text())


if __name__ == "__main__":
    main()
