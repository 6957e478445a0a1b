"""Run under mpirun: the parameter stream over a synthetic node map (real MPI, one machine).

World rank 0 publishes versions 1..VERSIONS (every parameter = the version number), then the stop
word; every other rank is a holder and polls until the stop word, recording each version it saw
and whether the parameters matched it (no torn copy). Rank `slow` sleeps between polls. Each rank
writes its record to OUT/rank<r>.json.
"""
import json
import sys
import time

import numpy as np

from hpcrl.core.messages import STOP, weights_spec
from hpcrl.runtime import comm
from hpcrl.runtime.params import build_parameter_stream

VERSIONS, PARAMS = 300, 100_000


def main(out: str, nodes: list[int], slow: int) -> None:
    rank, size = comm.JOB.Get_rank(), comm.JOB.Get_size()
    end = build_parameter_stream(comm.JOB, rank, 0, list(range(1, size)), np.array(nodes),
                                 weights_spec(PARAMS))
    record = {"versions": [], "torn": 0}
    if rank == 0:
        for v in range(1, VERSIONS + 1):
            end.publish(v, lambda flat, v=v: flat.fill(v))
        end.publish(VERSIONS + 1, lambda flat: flat.fill(VERSIONS + 1), flags=STOP)
        end.wait()
    else:
        while True:
            message = end.poll()
            if message is not None:
                v = message.get("version")
                record["versions"].append(v)
                record["torn"] += int(not np.all(message["params"] == v))
                if message.get("flags") & STOP:
                    break
            if rank == slow:
                time.sleep(0.005)
        while not end.finished():  # a leader passes the last version on before it closes
            pass
        end.close()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(record, fh)


if __name__ == "__main__":
    main(sys.argv[1], [int(n) for n in sys.argv[2].split(",")], int(sys.argv[3]))
