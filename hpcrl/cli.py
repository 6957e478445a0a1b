"""Command line: `hpcrl run CONFIG.yaml` (under mpirun/srun) and `hpcrl plan CONFIG.yaml`."""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcrl", description="Distributed reinforcement learning over MPI.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train: every MPI rank runs this; the config assigns the roles",
                         description="Run under mpirun/srun, e.g. mpirun -n 4 python -m hpcrl run jobs/cartpole_ppo.yaml")
    run.add_argument("config", help="rank-role YAML config")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config value, e.g. --set run.total_frames=20000 (repeatable)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run directory of the same name")
    plan = sub.add_parser("plan", help="print the rank layout a config gets at a world size (no MPI needed)")
    plan.add_argument("config", help="rank-role YAML config")
    plan.add_argument("--world-size", type=int, required=True, help="number of MPI ranks")
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    return p


def _plan(args) -> int:
    from hpcrl.config import ConfigError, load_config
    from hpcrl.layout import INLINE, plan_layout
    try:
        cfg, _ = load_config(args.config, tuple(args.overrides))
        layout = plan_layout(cfg.roles, args.world_size)
    except ConfigError as exc:
        print(f"hpcrl: config error: {exc}", file=sys.stderr)
        return 2
    if layout.serial:
        print("world size 1: serial mode, rank 0 runs learner + env with inline inference")
        return 0
    print(f"world size {layout.world_size}: {len(layout.learners)} learner, {len(layout.inference)} inference, "
          f"{len(layout.envs)} env ranks x {cfg.env.num_envs} envs")
    for r in layout.learners:
        print(f"  rank {int(r):>6}  learner    fragments from {len(layout.envs_of_learner(int(r)))} env ranks")
    for r in layout.inference:
        print(f"  rank {int(r):>6}  inference  serves {len(layout.envs_of_inference(int(r)))} env ranks")
    for i, r in enumerate(layout.envs):
        inf = int(layout.env_inference[i])
        print(f"  rank {int(r):>6}  env        inference {'inline' if inf == INLINE else f'rank {inf}'}, "
              f"learner rank {int(layout.env_learner[i])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "plan":
        return _plan(args)
    from hpcrl.run import run  # imports mpi4py, which initialises MPI
    return run(args.config, tuple(args.overrides), args.overwrite)


if __name__ == "__main__":
    sys.exit(main())
