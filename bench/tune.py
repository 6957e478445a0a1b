"""hpcrl tune against measured runs, as JSON: for each config, `hpcrl tune`'s measurements and its
ranked layouts for this machine (--ranks-per-node ranks on its own cores), then real runs (training
on) of the config's own layout, the tuned one and the next best few, each measured for the same
time (the best layout of each role count, fastest first). Reported per layout: predicted and measured frames/s (trained frames: an async run's dropped
fragments are sampled but not trained) and their ratio; per config: tuned / shipped trained
frames/s (target: >= 1.2, or the shipped layout is already the model's best).

    .venv/bin/python bench/tune.py [--configs jobs/cartpole_ppo.yaml ...] [--ranks 4] [--seconds 25] [--set K=V]
        [--out FILE]
        [--plot IMAGE]          (or --replot FILE... --plot IMAGE: draw earlier outputs again, together)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit, run_rate  # noqa: E402


def layout_name(choice) -> str:
    L, I, E = choice.counts
    return f"{L} learner + {I} inference + {E} env x {choice.cfg.env.num_envs} envs, {choice.cfg.env.groups} group(s)"


def plot(reports: list[dict], path: str, within: float = 0.25) -> None:
    """Predicted against measured trained frames/s, one point per run, with the +-25% band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 5))
    top = 0.0
    for report, marker in zip(reports, "os^Dv"):
        runs = report["runs"]
        x, y = [r["predicted_frames_per_s"] for r in runs], [r["trained_frames_per_s"] for r in runs]
        label = " ".join([report["config"], *report.get("overrides", [])])
        ax.scatter(x, y, marker=marker, label=label, zorder=3)
        for r in runs:
            L, I, E = (int(w) for w in r["layout"].split(" x ")[0].split()[::3])
            ax.annotate(f"{L}L {I}I {E}E {r['layout'].split(' x ')[1].split(',')[0]}", (r["predicted_frames_per_s"],
                        r["trained_frames_per_s"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        top = max(top, *x, *y)
    line = [50, 1.3 * top]
    ax.plot(line, line, "k-", lw=0.8, label="measured = predicted")
    ax.fill_between(line, [(1 - within) * v for v in line], [(1 + within) * v for v in line], color="0.88",
                    label=f"within {within:.0%}", zorder=0)
    ax.set(xlabel="predicted frames/s (hpcrl tune)", ylabel="measured trained frames/s", xlim=(50, line[1]),
           ylim=(50, line[1]), xscale="log", yscale="log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    from hpcrl.core.config import to_dict
    from hpcrl.tools.tune import tune
    from hpcrl.tools.tune.measure import replays
    from hpcrl.tools.tune.search import pick
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["jobs/cartpole_ppo.yaml", "jobs/cartpole_appo.yaml",
                                                          "jobs/cartpole_dqn.yaml"])
    parser.add_argument("--ranks", type=int, default=4, help="ranks of every run (on this machine's cores)")
    parser.add_argument("--seconds", type=float, default=25.0, help="measured seconds per run")
    parser.add_argument("--layouts", type=int, default=3, help="runs per config besides the shipped layout")
    parser.add_argument("--budget-s", type=float, default=30.0, help="hpcrl tune's measuring budget")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every config (e.g. algo.replay.warmup=2000, so that a short "
                             "run trains)")
    parser.add_argument("--out")
    parser.add_argument("--plot", help="also draw predicted against measured frames/s into this image")
    parser.add_argument("--replot", nargs="+", help="only draw --plot from these earlier JSON outputs")
    args = parser.parse_args()
    if args.replot:
        import json
        plot([c for path in args.replot for c in json.loads(Path(path).read_text())["configs"]], args.plot)
        return
    cores = os.cpu_count() or 1
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs:
            tuned = tune(str(REPO / config), args.ranks, 1, cores, args.budget_s, tuple(args.overrides))
            chosen = [("shipped", tuned.own)] if tuned.own is not None else []
            # the tuned layout, then the pick of each other role count (learner, inference, env ranks), fastest first
            seen = {tuned.own.counts} if tuned.own is not None and tuned.best is tuned.own else set()
            for c in [tuned.best, *tuned.ranked]:
                if c.counts not in seen and len(chosen) <= args.layouts:
                    seen.add(c.counts)
                    best = c if c is tuned.best else pick([d for d in tuned.ranked if d.counts == c.counts])
                    chosen.append((f"rank {tuned.ranked.index(best) + 1}", best))
            runs = []
            for label, choice in chosen:
                path = Path(tmp) / f"{len(runs)}.yaml"
                path.write_text(yaml.safe_dump(to_dict(choice.cfg), sort_keys=False))
                measured = run_rate(str(path), args.ranks, args.seconds, tmp, f"tune{len(runs)}", [])
                p = choice.prediction
                if replays(choice.cfg):  # DQN: every frame goes into a replay shard; and the learners' steps
                    trained = measured["frames_per_s"]
                    steps = {"predicted_gradient_steps_per_s": round(p.gradient_steps_per_s, 1),
                             "gradient_steps_per_s": round(measured["updates_per_s"] *
                                                           choice.cfg.algo.dqn.gradient_steps, 1)}
                else:  # what the model predicts: frames trained (async runs also count the fragments they drop)
                    trained, steps = measured["updates_per_s"] * choice.cfg.algo.batch_frames, {}
                runs.append({"label": label, "layout": layout_name(choice),
                             "predicted_frames_per_s": round(p.frames_per_s, 1),
                             "bound": p.bound, **measured, "trained_frames_per_s": round(trained, 1),
                             "measured_over_predicted": round(trained / p.frames_per_s, 3), **steps})
            shipped_run = next((r for r in runs if r["label"] == "shipped"), None)
            own_best = tuned.own is not None and tuned.best.cfg == tuned.own.cfg
            tuned_run = shipped_run if own_best else runs[1 if shipped_run else 0]
            tuned_run["tuned"] = True
            reports.append({"config": config, "overrides": args.overrides, "measured_costs_us": {k: [list(map(int, xs)), [round(y * 1e6, 1) for y in ys]]
                                                                    for k, (xs, ys) in tuned.points.items()},
                            "runs": runs,
                            "tuned_over_shipped": (round(tuned_run["trained_frames_per_s"] /
                                                         shipped_run["trained_frames_per_s"], 3)
                                                   if shipped_run else None),
                            "shipped_is_model_best": own_best})
    emit({"benchmark": "tune", "ranks": args.ranks, "cores": cores, "seconds_per_run": args.seconds,
          "configs": reports, "targets": {"tuned_over_shipped": 1.2, "within": 0.25}}, args.out)
    if args.plot:
        plot(reports, args.plot)


if __name__ == "__main__":
    main()
