"""Run under mpirun -n 4: a population member's state copied between two learner groups.

Ranks 0-1 are member A's learners, ranks 2-3 member B's. Every rank builds the same network with
its own seed and takes its own Adam steps, so all four states differ. Then A's learner root
(rank 0) sends its state to B's (rank 2), which broadcasts it over B's learners. Afterwards every
rank takes the same step on the same data. Each rank writes OUT/rank<r>.json: the digest of its
weights and optimizer state right after the copy and after the shared step.
"""
import hashlib
import json
import sys

import torch
from mpi4py import MPI

from hpcrl.core.config import ModelConfig
from hpcrl.envs import EnvSpaces
from hpcrl.models import build_model, member_arrays, member_layout
from hpcrl.models.adam import Adam
from hpcrl.runtime.member_copy import MemberState, broadcast_state, receive_state, send_state


def step(model, optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    optimizer.zero_grad()
    obs = torch.randn(32, 4, generator=gen)
    logp, entropy, value = model.evaluate(obs, torch.randint(0, 2, (32,), generator=gen))
    (logp.mean() + 0.5 * value.pow(2).mean() - 0.01 * entropy.mean()).backward()
    optimizer.step()


def digest(model, optimizer) -> str:
    h = hashlib.sha256()
    for array in member_arrays(model, optimizer):
        h.update(array.tobytes())
    return h.hexdigest()


def main(out: str) -> None:
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    member = rank // 2  # 0: A (ranks 0, 1), 1: B (ranks 2, 3)
    group = world.Split(member, rank)
    torch.manual_seed(100 + rank)
    model = build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[64, 64], obs_norm=True))
    optimizer = Adam(model.parameters(), lr=1e-3, eps=1e-5)
    for i in range(3 + rank):  # a different number of steps on different data: different step counts too
        step(model, optimizer, seed=1000 * rank + i)
    state = MemberState(member_arrays(model, optimizer), member_layout(model))
    before = digest(model, optimizer)
    if rank == 0:
        send_state(world, state, dest=2)
    elif rank == 2:
        receive_state(world, state, source=0)
    if member == 1:
        broadcast_state(group, state)
    after_copy = digest(model, optimizer)
    step(model, optimizer, seed=7)  # the same step everywhere
    record = {"before": before, "after_copy": after_copy, "after_step": digest(model, optimizer),
              "fingerprint": state.fingerprint(), "nbytes": state.nbytes,
              "adam_step": float(optimizer.state[next(model.parameters())]["step"])}
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(record, fh)


if __name__ == "__main__":
    main(sys.argv[1])
