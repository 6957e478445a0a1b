"""Gradient averaging between 2 learners, as JSON: Horovod's DistributedOptimizer with per-tensor
hooks, with one group of all parameters (as the learner uses it), and one flat allreduce, against
MPI.Allreduce of the same flat float32 buffer measured in the same run. Models: the CartPole MLP and a 5M-parameter MLP.

    .venv/bin/python bench/allreduce.py [--out FILE]      (starts itself under mpirun -n 2)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import under_mpi  # noqa: E402

MODELS = [("cartpole_mlp_64x64", (4,), 2, [64, 64], 200), ("mlp_5M", (512,), 18, [1024, 1024, 1024], 30)]


def measure(name, obs_shape, actions, hidden, repeats):
    import horovod.torch as hvd
    import numpy as np
    import torch

    from hpcrl.runtime import comm
    from hpcrl.core.config import ModelConfig
    from hpcrl.envs import EnvSpaces
    from hpcrl.models import build_model, num_params
    from report import median_seconds
    torch.manual_seed(0)
    spaces = EnvSpaces(obs_shape=obs_shape, obs_dtype="float32", num_actions=actions)
    model = build_model(spaces, ModelConfig(hidden_sizes=hidden))
    plain = build_model(spaces, ModelConfig(hidden_sizes=hidden))  # no Horovod hooks on it
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), fused=True),
                                   named_parameters=model.named_parameters())
    grouped_model = build_model(spaces, ModelConfig(hidden_sizes=hidden))
    grouped = hvd.DistributedOptimizer(torch.optim.Adam(grouped_model.parameters(), fused=True),  # as the learner
                                       named_parameters=[(f"g.{n}", p) for n, p in grouped_model.named_parameters()],
                                       groups=[list(grouped_model.parameters())])
    obs = torch.randn(256, *obs_shape)
    acts = torch.randint(0, actions, (256,))

    def backward():
        opt.zero_grad()
        logp, ent, v = model.evaluate(obs, acts)
        (logp.mean() + v.mean() + ent.mean()).backward()

    def horovod_step():  # what the learner does per minibatch, communication included
        backward()
        opt.synchronize()

    def grouped_step():  # the learner's way: one group, one fused allreduce per minibatch
        grouped.zero_grad()
        logp, ent, v = grouped_model.evaluate(obs, acts)
        (logp.mean() + v.mean() + ent.mean()).backward()
        grouped.synchronize()

    def local_step():  # the same backward without averaging: subtracting it leaves the communication
        plain.zero_grad()
        logp, ent, v = plain.evaluate(obs, acts)
        (logp.mean() + v.mean() + ent.mean()).backward()

    flat = torch.zeros(num_params(model))
    flat_np = np.zeros(num_params(model), dtype=np.float32)
    out_np = np.empty_like(flat_np)
    world = comm.WORLD
    for fn in (horovod_step, grouped_step, local_step):
        fn()  # warm-up (Horovod negotiates tensors on first use)
    world.Barrier()
    t_hvd = median_seconds(horovod_step, repeats)
    world.Barrier()
    t_grouped = median_seconds(grouped_step, repeats)
    t_local = median_seconds(local_step, repeats)
    world.Barrier()
    t_flat = median_seconds(lambda: hvd.allreduce_(flat, op=hvd.Average, name=f"flat.{name}"), repeats)
    world.Barrier()
    t_mpi = median_seconds(lambda: world.Allreduce(flat_np, out_np, op=comm.MPI.SUM), repeats)
    hooks_ms = max(t_hvd - t_local, 0.0) * 1e3
    grouped_ms = max(t_grouped - t_local, 0.0) * 1e3
    return {"model": name, "params": num_params(model), "gradient_bytes": 4 * num_params(model),
            "horovod_hooks_extra_ms": round(hooks_ms, 3), "horovod_grouped_extra_ms": round(grouped_ms, 3),
            "horovod_flat_ms": round(t_flat * 1e3, 3),
            "mpi_allreduce_ms": round(t_mpi * 1e3, 3),
            "ratio_hooks_to_mpi": round(hooks_ms / (t_mpi * 1e3), 2),
            "ratio_grouped_to_mpi": round(grouped_ms / (t_mpi * 1e3), 2),
            "ratio_flat_to_mpi": round(t_flat / t_mpi, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    args = parser.parse_args()
    under_mpi(2, __file__, args.out)
    from hpcrl.runtime import comm  # MPI at THREAD_MULTIPLE before Horovod starts its thread
    import horovod.torch as hvd
    import torch
    torch.set_num_threads(1)
    os.environ.setdefault("HOROVOD_CYCLE_TIME", "0.1")  # as the learners set it (hpcrl/workers/averaging.py)
    hvd.init(comm=comm.WORLD)
    results = [measure(*m) for m in MODELS]
    if comm.world_rank() == 0:
        from report import emit
        emit({"benchmark": "allreduce: Horovod gradient averaging vs MPI.Allreduce, 2 learners on one node",
              "horovod_cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME", "default"),
              "results": results}, args.out)


if __name__ == "__main__":
    main()
