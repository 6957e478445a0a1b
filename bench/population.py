"""A population member's copy between two learner groups (PBT's exploit step, issue 28) against
raw mpi4py moving the same bytes, 4 ranks: member A's learners are ranks 0-1, member B's 2-3.

The member is an actor-critic of about 10.8M parameters (MLP 64 -> 2048 -> 2048 -> 512, actor and
critic) with its Adam state, as `hpcrl.models.member_arrays` lays it out: the parameters' arena,
Adam's steps and two moments (about 130 MB in four arrays). Two cases, each timed on rank 0 from
the start of the send until the last receiver has acknowledged (a 1-byte message back):
- send: A's learner root -> B's learner root. Project: `runtime/member_copy.send_state` /
  `receive_state`, straight out of and into the tensors' memory. Raw: `MPI.Send` / `MPI.Recv` of
  one preallocated numpy buffer of the same size.
- send + broadcast: then over B's learners. Project: `broadcast_state`; raw: `Bcast`.
Rounds alternate project and raw; medians. Ratio: project / raw (target <= 1.5). Idle ranks wait
in sleeping barriers, so the two cores go to the ranks that move bytes.

Before that, the exploit pause in a real population: jobs/cartpole_pbt.yaml (8 serial members on
8 ranks) for 40,000 frames a member, judged every 2,048 (many copies), with no target: the
seconds the members' learner roots spent sending or receiving copies (`exploit_pause_s` in each
member's metrics) over their training seconds.

    .venv/bin/python bench/population.py [--out FILE] [--repeats 9]   (starts itself under mpirun -n 4)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import under_mpi  # noqa: E402

OBS, HIDDEN, ACTIONS = 64, [2048, 2048, 512], 4
ACK_TAG = 9


def measure(repeats: int) -> dict | None:
    import numpy as np
    import torch

    from hpcrl.core.config import ModelConfig
    from hpcrl.envs import EnvSpaces
    from hpcrl.models import build_model, member_arrays, member_layout, num_params
    from hpcrl.models.adam import Adam
    from hpcrl.runtime import comm
    from hpcrl.runtime.member_copy import MemberState, broadcast_state, receive_state, send_state

    world = comm.WORLD
    rank = world.Get_rank()
    group = world.Split(rank // 2, rank)  # member A: ranks 0-1, member B: ranks 2-3
    torch.manual_seed(rank)
    model = build_model(EnvSpaces((OBS,), "float32", ACTIONS), ModelConfig(hidden_sizes=HIDDEN))
    state = MemberState(member_arrays(model, Adam(model.parameters())), member_layout(model))
    raw = np.full(state.nbytes, rank, dtype=np.uint8)
    ack = np.zeros(1, dtype=np.uint8)

    def barrier() -> None:
        comm.wait_sleeping(world.Ibarrier())

    def copy(project: bool, broadcast: bool) -> float | None:
        barrier()
        last = 3 if broadcast else 2  # the rank whose acknowledgement ends the copy
        start = time.perf_counter()
        if rank == 0:
            send_state(world, state, 2) if project else world.Send(raw, dest=2)
            comm.wait_sleeping(world.Irecv(ack, source=last, tag=ACK_TAG))
            return time.perf_counter() - start
        if rank == 2:
            receive_state(world, state, 0) if project else world.Recv(raw, source=0)
        if broadcast and rank in (2, 3):
            broadcast_state(group, state) if project else group.Bcast(raw, root=0)
        if rank == last:
            world.Send(ack, dest=0, tag=ACK_TAG)
        return None

    times: dict[str, list[float]] = {}
    for round_ in range(repeats + 1):  # one warm-up round (first touches of the pages)
        for broadcast in (False, True):
            for project in (True, False):
                seconds = copy(project, broadcast)
                if rank == 0 and round_ > 0:
                    times.setdefault(f"{'send_broadcast' if broadcast else 'send'}_"
                                     f"{'project' if project else 'raw'}", []).append(seconds)
    if rank != 0:
        return None
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    out = {"member_params": num_params(model), "member_state_bytes": int(state.nbytes), "repeats": repeats,
           **{f"{name}_ms": round(value, 2) for name, value in ms.items()}}
    for case in ("send", "send_broadcast"):
        out[f"{case}_ratio_project_to_raw"] = round(ms[f"{case}_project"] / ms[f"{case}_raw"], 3)
        out[f"{case}_project_gb_s"] = round(state.nbytes / ms[f"{case}_project"] / 1e6, 2)
    return out


PAUSE_FILE = "HPCRL_BENCH_POPULATION_PAUSE"  # the pause measured before the copies, for rank 0's report


def exploit_pause() -> dict:
    """The exploit pause of a real population (outside MPI: it starts its own job)."""
    from hpcrl.core.population import exploits_taken
    from hpcrl.io.metrics import read_metrics
    with tempfile.TemporaryDirectory() as out:
        sets = ["run.total_frames=40000", "run.target_return=null", "population.ready_frames=2048",
                f"run.output_dir={out}"]
        cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", "8", sys.executable, "-m", "hpcrl", "run",
               str(REPO / "jobs/cartpole_pbt.yaml"), *(a for kv in sets for a in ("--set", kv))]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        members = [read_metrics(f"{out}/cartpole_pbt/member{m}/metrics.h5") for m in range(8)]
        lineage = read_metrics(f"{out}/cartpole_pbt/metrics.h5")
    pause = sum(float(m["exploit_pause_s"][-1]) for m in members)
    training = sum(float(m["wall_time"][-1]) for m in members)
    return {"job": "jobs/cartpole_pbt.yaml, 8 ranks, 40,000 frames a member, population.ready_frames 2048",
            "copies": len(exploits_taken(lineage["event"], lineage["member"], lineage["parent"])),
            "pause_s": round(pause, 3), "training_s": round(training, 1), "pause_fraction": round(pause / training, 5)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
            json.dump(exploit_pause(), fh)
        os.environ[PAUSE_FILE] = fh.name
    under_mpi(4, __file__, args.out)
    import torch
    torch.set_num_threads(1)
    result = measure(args.repeats)
    if result is not None:
        from report import emit
        pause = None
        if PAUSE_FILE in os.environ:
            pause = json.loads(Path(os.environ[PAUSE_FILE]).read_text())
            os.unlink(os.environ[PAUSE_FILE])
        emit({"benchmark": "population: a member's copy between learner groups vs raw mpi4py, 4 ranks on one node",
              "target": "send_ratio_project_to_raw <= 1.5", "results": result, "exploit_pause": pause}, args.out)


if __name__ == "__main__":
    main()
