"""Run under mpirun: the control stream over a synthetic node map (real MPI, one machine).

Rank `root` is the controller: it sends the stop word (STOP | PREEMPTED, at version 42) after a
short while; every rank polls until its end is finished (it has the word and has passed it on),
then writes what it heard and its tree links to OUT/rank<r>.json.
"""
import json
import sys
import time

import numpy as np

from hpcrl.core.messages import PREEMPTED
from hpcrl.runtime import comm
from hpcrl.runtime.control import build_control_stream


def main(out: str, nodes: list[int], root: int) -> None:
    rank = comm.JOB.Get_rank()
    control = build_control_stream(comm.JOB, rank, root, np.array(nodes))
    if rank == root:
        time.sleep(0.2)  # the others are polling by now
        control.stop(PREEMPTED, version=42)
    polls = 0
    while not control.finished():
        polls += 1
    control.close()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump({"flags": control.stop_flags, "version": control.version, "parent": control.parent,
                   "children": control.children, "polls": polls}, fh)


if __name__ == "__main__":
    main(sys.argv[1], [int(n) for n in sys.argv[2].split(",")], int(sys.argv[3]))
