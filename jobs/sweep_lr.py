"""Several learning rates, one after another, in one allocation: hpcrl as a library
(docs/python-api.md). Every rank of the job runs this script, and each run uses them all.

    mpirun -n 4 python jobs/sweep_lr.py jobs/cartpole_ppo.yaml 3.0e-4 1.0e-3
    mpirun -n 4 python jobs/sweep_lr.py CONFIG LR [LR ...] [--set KEY=VALUE ...]

Each run is named after the config's run.name and its rate (cartpole_ppo_lr0.0003), in the
config's output_dir; a run already done says so, one preempted resumes, as `hpcrl run` does. The
script stops at the first run that does not finish (a config error: 2; a signal: 3, its
checkpoint written) and exits with its status, so a job script can requeue it.
"""
import argparse
import sys

import hpcrl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("lrs", nargs="+", type=float)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    try:
        base = hpcrl.Config.from_yaml(args.config, tuple(args.overrides))
    except hpcrl.ConfigError:  # hpcrl.run says what is wrong, once (rank 0), and every rank gets 2
        return hpcrl.run(args.config, tuple(args.overrides))
    for lr in args.lrs:
        # each run: the base config with its rate and name; hpcrl.run checks it as `hpcrl run` checks a file
        status = hpcrl.run(base, overrides=(f"algo.lr={lr!r}", f"run.name={base.run.name}_lr{lr:g}"))
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
