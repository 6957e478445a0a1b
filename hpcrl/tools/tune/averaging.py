"""`hpcrl tune`'s measurement of averaging between two learners: under `mpirun -n 2`, both ranks
time the algorithm's own update (tools/tune/measure.UpdateBench) on the same per-learner batch,
first alone, then with the trainers' Horovod averaging (workers/averaging.py: start_horovod,
averaging_optimizer), and rank 0 prints, as one JSON line, the wall seconds that averaging adds to
a gradient step.

That wait is more than the allreduce's messages: each step waits for Horovod's background thread
and for the other learner, which on a busy node shares the cores with other threads and ranks
(2 learners on this 2-core machine: 2-4 ms per gradient step of CartPole's PPO and DQN, against 0.03
ms for the allreduce's messages alone; the Nature CNN's steps of about 0.1 s hide it in their noise). The tuner's model charges it
per gradient step. It is measured with both learners on CPUs of this machine, and charged as it is
to the target's learners, GPUs or not, wherever they are.

    mpirun -n 2 python -m hpcrl.tools.tune.averaging CONFIG [--set KEY=VALUE ...] [--seconds S]
"""
from __future__ import annotations

import argparse
import json
import time


def wall_seconds(call, seconds: float, comm) -> float:
    """Wall seconds per call over about `seconds` of calls, both ranks starting together and making
    the same number of calls (an averaging step waits for the other rank's)."""
    call()  # warm-up (Horovod negotiates its tensors at the first allreduce)
    comm.Barrier()
    start = time.perf_counter()
    count = 0
    while True:
        call()
        count += 1
        # rank 0 decides when to stop, so both make the same number of calls
        if comm.bcast(time.perf_counter() - start >= seconds and count >= 3, root=0):
            return (time.perf_counter() - start) / count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of each of the two timings")
    args = parser.parse_args(argv)
    from hpcrl.runtime import comm  # MPI at THREAD_MULTIPLE before Horovod starts its thread
    from hpcrl.core.config import load_config
    from hpcrl.envs import env_spaces
    from hpcrl.core.config_sac import replay_settings
    from hpcrl.tools.tune.measure import UpdateBench, on_devices, replays
    from hpcrl.workers.averaging import averaging_hooks, averaging_optimizer, start_horovod
    world = comm.JOB
    if world.Get_size() != 2:
        raise SystemExit(f"hpcrl.tools.tune.averaging: run it on 2 ranks (mpirun -n 2), not {world.Get_size()}")
    cfg, _ = load_config(args.config, tuple(args.overrides))
    cfg = on_devices(cfg, "cpu")  # learners on CPUs (two on one GPU would share it)
    spaces = env_spaces(cfg.env)
    start_horovod(world)
    # one learner's share of a batch split in two: half a DQN batch, or a fragment of PPO's
    size = max(1, replay_settings(cfg.algo)[0].batch_size // 2) if replays(cfg) else 1
    alone = UpdateBench(cfg, spaces)
    averaged = UpdateBench(cfg, spaces, wrap=averaging_optimizer, hooks=averaging_hooks)
    seconds = {name: wall_seconds(bench.call(size), args.seconds, world)
               for name, bench in (("alone", alone), ("averaged", averaged))}
    extra = max(seconds["averaged"] - seconds["alone"], 0.0) / alone.steps_per_update
    if world.Get_rank() == 0:
        print(json.dumps({"step_s": extra, "alone_s": seconds["alone"], "averaged_s": seconds["averaged"],
                          "size": size, "steps_per_update": alone.steps_per_update}), flush=True)


if __name__ == "__main__":
    main()
